variable "name" {
  description = "Deployment name, used to name IAM policies."
  type        = string
}

variable "bucket_name" {
  description = "Name of the S3 bucket holding tabletstore's objects."
  type        = string
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

variable "kms_key_arn" {
  description = "KMS key for server-side encryption; null uses S3-managed keys (AES256)."
  type        = string
  default     = null
}

variable "force_destroy" {
  description = "Allow 'terraform destroy' to delete a bucket that still holds objects."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
