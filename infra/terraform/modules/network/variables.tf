variable "name" {
  type = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "name must be 1-31 lowercase letters, digits or '-', starting with a letter or digit."
  }
}

variable "cidr_block" {
  type    = string
  default = "10.40.0.0/16"
  validation {
    condition     = can(cidrnetmask(var.cidr_block))
    error_message = "cidr_block must be an IPv4 CIDR block such as 10.40.0.0/16."
  }
}

variable "availability_zones" {
  description = "One private subnet per zone; three zones give etcd one member each."
  type        = list(string)
  validation {
    condition     = length(var.availability_zones) >= 1 && length(var.availability_zones) <= 16
    error_message = "availability_zones must list 1 to 16 zones."
  }
}

variable "worker_port" {
  type    = number
  default = 7001
}

variable "master_port" {
  type    = number
  default = 7000
}

variable "metrics_port" {
  type    = number
  default = 9100
}

variable "kms_key_arn" {
  description = "Key for the flow-log group."
  type        = string
}

variable "log_retention_days" {
  type    = number
  default = 365
}

variable "tags" {
  type    = map(string)
  default = {}
}
