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

variable "subnet_cidrs" {
  description = "The subnets' CIDR blocks, in the order of subnet_ids (the network module's private_subnet_cidrs): each member's fixed address is a host of its subnet."
  type        = list(string)
}

variable "availability_zones" {
  description = "The subnets' zones, in the order of subnet_ids (the network module's availability_zones): a member's volume is made in its subnet's zone."
  type        = list(string)
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
  description = "The tabletstore image (ships etcd and etcdctl), in ECR."
  type        = string
  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.image_uri))
    error_message = "image_uri must be an ECR image (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG or @sha256:DIGEST)."
  }
}

variable "image_uid" {
  description = "The user id the image runs as (the Dockerfile's USER): etcd's data and TLS files are made its own."
  type        = number
  default     = 10001
}

variable "namespace" {
  description = "The cluster's etcd namespace (the path of client_url)."
  type        = string
  default     = "tabletstore"
  validation {
    condition     = can(regex("^[A-Za-z0-9._-]+$", var.namespace))
    error_message = "namespace must be letters, digits, '.', '_' or '-'."
  }
}

variable "client_tls_dir" {
  description = "Where tabletstore processes find the etcd client certificate (ca.pem, client.pem, client.key): named in client_url, written by the cluster module's tasks and the functions at start."
  type        = string
  default     = "/tmp/etcd-tls"
  validation {
    condition     = can(regex("^/tmp/[A-Za-z0-9._-]+$", var.client_tls_dir))
    error_message = "client_tls_dir must be a directory directly under /tmp (the one path Fargate tasks and Lambda functions both may write)."
  }
}

variable "quota_bytes" {
  description = "etcd's --quota-backend-bytes: past it etcd refuses writes until compacted and defragmented (the alarms module warns at 80%)."
  type        = number
  default     = 8589934592
  validation {
    condition     = var.quota_bytes >= 1073741824 && var.quota_bytes <= 8589934592
    error_message = "quota_bytes must be between 1 GiB and 8 GiB (etcd's suggested maximum)."
  }
}

variable "compaction_retention" {
  description = "etcd's --auto-compaction-retention in periodic mode: history older than this is compacted (a watch resuming from an older revision re-reads instead)."
  type        = string
  default     = "1h"
  validation {
    condition     = can(regex("^[0-9]+(m|h)$", var.compaction_retention))
    error_message = "compaction_retention must be a duration in minutes or hours, e.g. 30m or 1h."
  }
}

variable "bucket" {
  description = "The deployment's bucket (the bucket module's bucket): the members upload their snapshots to it."
  type        = string
}

variable "bucket_arn" {
  type = string
}

variable "snapshot_prefix" {
  description = "Key prefix of the snapshots in the bucket (the bucket module's etcd_snapshot_prefix); each member uploads under PREFIX<name>/<member>/."
  type        = string
  default     = "etcd-snapshots/"
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
