variable "name" {
  description = "Deployment name, prefixed to every function, role and queue."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "name must be 1-31 lowercase letters, digits or '-', starting with a letter or digit."
  }
}

variable "image_uri" {
  description = "The tabletstore container image (built from the repository's Dockerfile), in ECR, preferably by digest."
  type        = string
  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.image_uri))
    error_message = "image_uri must be an ECR image (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG or @sha256:DIGEST): Lambda runs images from ECR only."
  }
}

variable "cluster_url" {
  description = "The cluster's etcd:// URL with its client certificate's files under /tmp (the etcd module's client_url): the scheduled GC's event."
  type        = string
  validation {
    condition     = startswith(var.cluster_url, "etcd://")
    error_message = "cluster_url must be an etcd:// URL (the etcd module's client_url)."
  }
}

variable "etcd_client_secret_arn" {
  description = "Secrets Manager secret with the etcd client certificate as JSON {\"cert\",\"key\",\"ca\"} (infra/terraform/scripts/etcd-ca.sh): the compaction and GC functions read it at start."
  type        = string
}

variable "tls_secret_arn" {
  description = "Secrets Manager secret with the function role's RPC certificate as JSON {\"ca\",\"cert\",\"key\"} of the cluster CA (infra/terraform/scripts/cluster-tls.sh): the compaction and GC functions write it to /tmp/tls at start and reach the workers with it."
  type        = string
}

variable "gc_schedule" {
  description = "When garbage collection runs (an EventBridge schedule expression)."
  type        = string
  default     = "rate(6 hours)"
}

variable "bucket_arn" {
  type = string
}

variable "prefix" {
  description = "The deployment's key prefix in the bucket (ends in '/' or is empty)."
  type        = string
}

variable "kms_key_arn" {
  description = "The bucket's key (objects, logs, queue and environment are encrypted with it)."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets the functions run in."
  type        = list(string)
  validation {
    condition     = length(var.subnet_ids) > 0
    error_message = "subnet_ids must name at least one subnet."
  }
}

variable "security_group_ids" {
  type = list(string)
}

variable "reserved_concurrency" {
  description = "Concurrent executions reserved for (and capping) each function."
  type        = number
  default     = 20
  validation {
    condition     = var.reserved_concurrency >= 1
    error_message = "reserved_concurrency must be at least 1."
  }
}

variable "timeout_seconds" {
  type    = number
  default = 900
}

variable "log_sort_memory_mb" {
  type    = number
  default = 2048
}

variable "compaction_memory_mb" {
  type    = number
  default = 4096
}

variable "log_retention_days" {
  type    = number
  default = 365
}

variable "tags" {
  type    = map(string)
  default = {}
}
