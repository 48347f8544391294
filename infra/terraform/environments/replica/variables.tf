variable "region" {
  description = "AWS region of the deployment."
  type        = string
  validation {
    # The commercial, GovCloud and China partitions' region names.
    condition     = can(regex("^(us|eu|ap|sa|ca|me|af|il|mx)(-gov)?-(north|south|east|west|central|northeast|southeast|northwest|southwest)-[1-9]$|^cn-(north|northwest)-1$", var.region))
    error_message = "region must be an AWS region name such as us-east-1 or eu-west-2."
  }
}

variable "bucket_name" {
  description = "The S3 bucket to create (globally unique: a name another account holds fails at apply with BucketAlreadyExists)."
  type        = string
}

variable "availability_zones" {
  description = "Three zones of the region (one etcd member each), e.g. [\"us-east-1a\", \"us-east-1b\", \"us-east-1c\"]."
  type        = list(string)
  validation {
    condition     = length(var.availability_zones) == 3
    error_message = "availability_zones must list exactly three zones (a 3-member etcd, one per zone)."
  }
}

variable "image_uri" {
  description = "The tabletstore image in ECR (docker build . && docker push)."
  type        = string
  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$", var.image_uri))
    error_message = "image_uri must be an ECR image (ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG or @sha256:DIGEST): ECS tasks here and Lambda pull from ECR."
  }
}

variable "etcd_ami_id" {
  description = "Amazon Linux 2023 AMI for the etcd members."
  type        = string
}

variable "etcd_instance_type" {
  type    = string
  default = "m6i.large"
}

variable "etcd_ca_secret_arn" {
  description = "Secret with the etcd CA (infra/terraform/scripts/etcd-ca.sh)."
  type        = string
}

variable "etcd_client_secret_arn" {
  description = "Secret with the etcd client certificate (infra/terraform/scripts/etcd-ca.sh)."
  type        = string
}

variable "tls_secret_arns" {
  description = "Secrets with the cluster's RPC certificates, one per role, each JSON {\"ca\",\"cert\",\"key\"} (infra/terraform/scripts/cluster-tls.sh): master, worker, client (the cli task) and function (the compaction and GC functions)."
  type        = map(string)
  validation {
    condition     = alltrue([for role in ["master", "worker", "client", "function"] : can(regex("^arn:aws[a-z-]*:secretsmanager:", lookup(var.tls_secret_arns, role, "")))])
    error_message = "tls_secret_arns must name a Secrets Manager secret ARN for each of master, worker, client and function."
  }
}

variable "function_concurrency" {
  type    = number
  default = 20
}

variable "workers_min" {
  type    = number
  default = 3
}

variable "workers_max" {
  type    = number
  default = 12
}

variable "replace_all_at_once" {
  description = "Deploy the next image by stopping every old task first (a release whose wire protocol the running one refuses: docs/operations/cloud-deployment.md \"Upgrade\")."
  type        = bool
  default     = false
}

variable "alarm_email" {
  description = "An address subscribed to the alarms (null: subscribe to the alarm_topic_arn output yourself)."
  type        = string
  default     = null
}

# The source cluster (prod's outputs) ---------------------------------------------------------

variable "source_cluster_url" {
  description = "The source cluster's etcd:// URL as the replicator opens it: prod's etcd members and namespace, with ca=, cert= and key= naming files under /tmp/source-etcd-tls (where the replicator's init container writes source_etcd_client_secret_arn's certificate)."
  type        = string
  validation {
    condition     = startswith(var.source_cluster_url, "etcd://") && strcontains(var.source_cluster_url, "ca=/tmp/source-etcd-tls/") && strcontains(var.source_cluster_url, "cert=/tmp/source-etcd-tls/") && strcontains(var.source_cluster_url, "key=/tmp/source-etcd-tls/")
    error_message = "source_cluster_url must be an etcd:// URL whose ca=, cert= and key= name files under /tmp/source-etcd-tls/ (e.g. prod's cluster_url with /tmp/etcd-tls replaced)."
  }
}

variable "source_etcd_client_secret_arn" {
  description = "A secret in this region with a client certificate of the source's etcd (prod's etcd_client_secret_arn, replicated to this region)."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:secretsmanager:", var.source_etcd_client_secret_arn))
    error_message = "source_etcd_client_secret_arn must be a Secrets Manager secret ARN."
  }
}

variable "source_bucket_arn" {
  description = "The source's bucket (prod's bucket ARN): the replicator may list it and read its objects under source_prefix, nothing else."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.source_bucket_arn))
    error_message = "source_bucket_arn must be an S3 bucket ARN (arn:aws:s3:::NAME)."
  }
}

variable "source_prefix" {
  description = "The source's prefix in its bucket (prod's: prod/)."
  type        = string
  default     = "prod/"
  validation {
    condition     = can(regex("^[A-Za-z0-9._-]+/$", var.source_prefix))
    error_message = "source_prefix must be one path segment ending in '/', e.g. prod/."
  }
}

variable "source_kms_key_arn" {
  description = "The key the source's objects are encrypted with (prod's bucket module's kms_key_arn): the replicator may decrypt with it."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:kms:", var.source_kms_key_arn))
    error_message = "source_kms_key_arn must be a KMS key ARN."
  }
}

variable "replicated_tables" {
  description = "The tables of the source to follow (each needs a change retention there: tabletstore changes T 7d)."
  type        = list(string)
  validation {
    condition     = length(var.replicated_tables) > 0 && alltrue([for t in var.replicated_tables : can(regex("^[A-Za-z0-9_.-]+$", t))])
    error_message = "replicated_tables must name at least one table (letters, digits, '_', '.', '-')."
  }
}
