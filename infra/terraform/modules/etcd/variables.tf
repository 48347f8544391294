variable "name" {
  type = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "name must be 1-31 lowercase letters, digits or '-', starting with a letter or digit."
  }
}

variable "subnet_ids" {
  description = "Private subnets; member i goes to subnet i mod len (three give one zone each)."
  type        = list(string)
  validation {
    condition     = length(var.subnet_ids) >= 1
    error_message = "subnet_ids must name at least one subnet."
  }
}

variable "security_group_id" {
  description = "The network module's etcd group."
  type        = string
}

variable "ami_id" {
  description = "An Amazon Linux 2023 AMI (the boot script uses its aws CLI, dnf and docker)."
  type        = string
  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be an AMI id such as ami-0123456789abcdef0."
  }
}

variable "instance_type" {
  type    = string
  default = "m6i.large"
}

variable "volume_gb" {
  type    = number
  default = 20
}

variable "image_uri" {
  description = "The tabletstore image (ships etcd)."
  type        = string
}

variable "ca_secret_arn" {
  description = "Secrets Manager secret holding the cluster CA as JSON {\"cert\": PEM, \"key\": PEM} (infra/terraform/scripts/etcd-ca.sh)."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:secretsmanager:", var.ca_secret_arn))
    error_message = "ca_secret_arn must be a Secrets Manager secret ARN."
  }
}

variable "kms_key_arn" {
  type = string
}

variable "tags" {
  type    = map(string)
  default = {}
}
