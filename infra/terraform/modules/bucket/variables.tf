variable "name" {
  description = "Deployment name, used to name the key alias and IAM policies."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "name must be 1-31 lowercase letters, digits or '-', starting with a letter or digit."
  }
}

variable "bucket_name" {
  description = "Name of the S3 bucket holding tabletstore's objects (globally unique; the access-log bucket is <name>-access-logs)."
  type        = string
  validation {
    # S3's rules, less 12 characters for the "-access-logs" bucket beside it.
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,49}[a-z0-9]$", var.bucket_name)) && !can(regex("\\.\\.|^\\d+\\.\\d+\\.\\d+\\.\\d+$|^xn--", var.bucket_name))
    error_message = "bucket_name must be 3-51 characters of lowercase letters, digits, '.' and '-', start and end with a letter or digit, not look like an IP address and not start with 'xn--' (S3's rules; 12 characters are kept for the '-access-logs' bucket)."
  }
}

variable "prefix" {
  description = "Key prefix of this deployment inside the bucket (the path of the s3://bucket/prefix URL), ending in '/'."
  type        = string
  default     = "tabletstore/"
  validation {
    condition     = can(regex("^([^/].*/)?$", var.prefix))
    error_message = "prefix must be empty or end with '/' and not start with '/'."
  }
}

variable "access_log_days" {
  description = "Days the S3 access logs are kept."
  type        = number
  default     = 90
}

variable "force_destroy" {
  description = "Allow 'terraform destroy' to delete buckets that still hold objects."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}

variable "noncurrent_version_days" {
  description = "Days an object garbage collection deleted stays recoverable (a noncurrent version) before S3 expires it."
  type        = number
  default     = 30
  validation {
    condition     = var.noncurrent_version_days >= 1
    error_message = "noncurrent_version_days must be at least 1."
  }
}

variable "etcd_snapshot_days" {
  description = "Days the etcd members' snapshots (etcd-snapshots/ in the bucket) are kept."
  type        = number
  default     = 14
  validation {
    condition     = var.etcd_snapshot_days >= 1
    error_message = "etcd_snapshot_days must be at least 1."
  }
}
