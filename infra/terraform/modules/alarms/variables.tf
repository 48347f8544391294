variable "name" {
  type = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "name must be 1-31 lowercase letters, digits or '-', starting with a letter or digit."
  }
}

variable "kms_key_arn" {
  description = "The bucket module's key (its policy lets CloudWatch alarms publish to a topic encrypted with it)."
  type        = string
}

variable "alarm_email" {
  description = "An address subscribed to the alarm topic (it must confirm the subscription), or null."
  type        = string
  default     = null
}

variable "bucket" {
  type = string
}

variable "prefix" {
  description = "The deployment's key prefix (S3 request metrics are recorded for it)."
  type        = string
}

variable "ecs_cluster_name" {
  type = string
}

variable "master_service" {
  type = string
}

variable "worker_service" {
  type = string
}

variable "workers_min" {
  type = number
}

variable "functions" {
  description = "Function name by kind (the functions module's function_names)."
  type        = map(string)
}

variable "dead_letter_queue" {
  description = "The functions' dead-letter queue name."
  type        = string
}

variable "etcd_members" {
  description = "The etcd members' names (etcd-0, etcd-1, etcd-2)."
  type        = list(string)
}

variable "etcd_quota_bytes" {
  type = number
}

variable "s3_5xx_per_5_minutes" {
  description = "5xx answers from S3 in five minutes above which the alarm fires (S3 answers some 503 Slow Down under load; the clients retry them)."
  type        = number
  default     = 50
}

variable "tags" {
  type    = map(string)
  default = {}
}
