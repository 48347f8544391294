variable "name" {
  type = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "name must be 1-31 lowercase letters, digits or '-', starting with a letter or digit."
  }
}

variable "image_uri" {
  description = "The tabletstore container image (Dockerfile), in ECR."
  type        = string
  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.image_uri))
    error_message = "image_uri must be an ECR image (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG or @sha256:DIGEST): ECS tasks here and Lambda pull from ECR."
  }
}

variable "store_url" {
  type = string
  validation {
    condition     = startswith(var.store_url, "s3://")
    error_message = "store_url must be an s3:// URL (the bucket module's store_url)."
  }
}

variable "cluster_url" {
  description = "The cluster's etcd:// URL with its client certificate's files (the etcd module's client_url): every process's TABLETSTORE_URL."
  type        = string
  validation {
    condition     = startswith(var.cluster_url, "etcd://")
    error_message = "cluster_url must be an etcd:// URL (the etcd module's client_url)."
  }
}

variable "etcd_tls_dir" {
  description = "The directory under /tmp that cluster_url's ca=, cert= and key= name (the etcd module's client_tls_dir): the init container writes the certificate there."
  type        = string
  validation {
    condition     = can(regex("^/tmp/[A-Za-z0-9._-]+$", var.etcd_tls_dir))
    error_message = "etcd_tls_dir must be a directory directly under /tmp (the task's scratch volume)."
  }
}

variable "image_uid" {
  description = "The user id the image runs as (the Dockerfile's USER)."
  type        = number
  default     = 10001
}

variable "etcd_client_secret_arn" {
  description = "Secrets Manager secret with the etcd client certificate as JSON {\"cert\",\"key\",\"ca\"} (infra/terraform/scripts/etcd-ca.sh)."
  type        = string
}

variable "tls_secret_arns" {
  description = "Secrets Manager secrets with the RPC certificates, by role (master, worker, client), each JSON {\"ca\",\"cert\",\"key\"} of the cluster CA (infra/terraform/scripts/cluster-tls.sh): each task's init container writes its role's to /tmp/tls."
  type        = map(string)
  validation {
    condition     = alltrue([for role in ["master", "worker", "client"] : contains(keys(var.tls_secret_arns), role)])
    error_message = "tls_secret_arns must name the master, worker and client secrets."
  }
}

variable "bucket_policy_arn" {
  description = "The bucket module's read_write_policy_arn."
  type        = string
}

variable "invoke_policy_json" {
  description = "The functions module's invoke_policy_json."
  type        = string
}

variable "log_sort_function" {
  description = "The log-sort function's name (the functions module's function_names.log_sort): the master's --sort-executor lambda:NAME."
  type        = string
}

variable "compaction_function" {
  description = "The compaction function's name (the functions module's function_names.compaction): the master's --compaction-executor lambda:NAME."
  type        = string
}

variable "subnet_ids" {
  type = list(string)
}

variable "master_security_group_id" {
  type = string
}

variable "worker_security_group_id" {
  type = string
}

variable "clients_security_group_id" {
  description = "The network module's clients group: the one-off cli task runs in it."
  type        = string
}

variable "kms_key_arn" {
  type = string
}

variable "master_port" {
  type    = number
  default = 7000
}

variable "worker_port" {
  type    = number
  default = 7001
}

variable "metrics_port" {
  type    = number
  default = 9100
}

variable "master_cpu" {
  type    = number
  default = 1024
}

variable "master_memory" {
  type    = number
  default = 2048
}

variable "worker_cpu" {
  type    = number
  default = 2048
}

variable "worker_memory" {
  type    = number
  default = 8192
}

variable "workers_min" {
  type    = number
  default = 3
  validation {
    condition     = var.workers_min >= 1
    error_message = "workers_min must be at least 1."
  }
}

variable "workers_max" {
  type    = number
  default = 12
}

variable "worker_cpu_target" {
  description = "Average worker CPU (percent) the autoscaler keeps."
  type        = number
  default     = 60
}

variable "replace_all_at_once" {
  description = "Deploy by stopping every old task before starting new ones (for a release whose wire protocol the running one refuses); otherwise tasks roll one by one."
  type        = bool
  default     = false
}

variable "log_retention_days" {
  type    = number
  default = 365
}

variable "tags" {
  type    = map(string)
  default = {}
}

variable "replication" {
  description = <<-EOT
    Make this cluster a replica of tables of a source cluster, typically in another region
    (docs/operations/replication.md): a `replicator` service (one task) runs
    `tabletstore replicate --source SOURCE_URL TABLES...`. It reads the source's etcd (with the
    source's etcd client certificate, source_etcd_client_secret_arn, written to
    source_etcd_tls_dir, which source_url's ca=, cert= and key= name) and the source's bucket
    (read only: its task role may list the bucket, get the objects under source_prefix and
    decrypt with source_kms_key_arn, and nothing else: it writes through this cluster's
    workers). The RPC certificates of both clusters must come from one cluster CA (the task
    uses this cluster's client certificate for both). null: no replication.
  EOT
  type = object({
    source_url                    = string
    source_etcd_tls_dir           = string
    source_etcd_client_secret_arn = string
    source_bucket_arn             = string
    source_prefix                 = string
    source_kms_key_arn            = string
    tables                        = list(string)
  })
  default = null
  validation {
    condition     = var.replication == null || startswith(try(var.replication.source_url, ""), "etcd://")
    error_message = "replication.source_url must be the source cluster's etcd:// URL (its etcd module's client_url)."
  }
  validation {
    condition     = var.replication == null || length(try(var.replication.tables, [])) > 0
    error_message = "replication.tables must name at least one table to follow."
  }
  validation {
    condition     = var.replication == null || can(regex("^/tmp/[A-Za-z0-9._-]+$", try(var.replication.source_etcd_tls_dir, "")))
    error_message = "replication.source_etcd_tls_dir must be a directory directly under /tmp (the task's scratch volume), other than etcd_tls_dir."
  }
  validation {
    condition     = var.replication == null || startswith(try(var.replication.source_bucket_arn, ""), "arn:")
    error_message = "replication.source_bucket_arn must be the source bucket's ARN (its bucket module's bucket_arn)."
  }
}
