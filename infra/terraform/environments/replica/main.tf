# A replica of prod in a second region: its own bucket, network, etcd, functions, cluster and
# alarms, as prod has them, and a replicator service that follows chosen tables of prod
# through their change streams (docs/operations/replication.md; the cluster module's
# var.replication). Its own state (key below), so that it is applied, and keeps serving reads,
# while the source's region is out. In short (docs/operations/cloud-deployment.md
# "A replica in a second region"):
#   terraform init -backend-config=backend.hcl
#   terraform apply -var-file=replica.tfvars     (region, and the source_* values of prod's outputs)
#   $(terraform output -raw cli_run_task)"command":["replication","status"]}]}'

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
  # State in S3 with a DynamoDB lock; bucket, table and region come from
  # `terraform init -backend-config=backend.hcl` (the bootstrap root prints the file).
  backend "s3" {
    key     = "tabletstore/replica/terraform.tfstate"
    encrypt = true
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = { project = "tabletstore", environment = "replica" }
  }
}

locals {
  name = "replica"
  tags = { project = "tabletstore", environment = "replica" }
  # Where the replicator's init container writes the source's etcd client certificate: the
  # directory var.source_cluster_url's ca=, cert= and key= must name.
  source_etcd_tls_dir = "/tmp/source-etcd-tls"
}

module "storage" {
  source        = "../../modules/bucket"
  name          = local.name
  bucket_name   = var.bucket_name
  prefix        = "replica/"
  force_destroy = false
  tags          = local.tags
}

module "network" {
  source             = "../../modules/network"
  name               = local.name
  availability_zones = var.availability_zones
  kms_key_arn        = module.storage.kms_key_arn
  tags               = local.tags
}

module "etcd" {
  source             = "../../modules/etcd"
  name               = local.name
  subnet_ids         = module.network.private_subnet_ids
  subnet_cidrs       = module.network.private_subnet_cidrs
  availability_zones = module.network.availability_zones
  security_group_id  = module.network.security_group_ids["etcd"]
  ami_id             = var.etcd_ami_id
  instance_type      = var.etcd_instance_type
  image_uri          = var.image_uri
  ca_secret_arn      = var.etcd_ca_secret_arn
  kms_key_arn        = module.storage.kms_key_arn
  bucket             = module.storage.bucket
  bucket_arn         = module.storage.bucket_arn
  snapshot_prefix    = module.storage.etcd_snapshot_prefix
  tags               = local.tags
}

module "functions" {
  source                 = "../../modules/functions"
  name                   = local.name
  image_uri              = var.image_uri
  cluster_url            = module.etcd.client_url
  etcd_client_secret_arn = var.etcd_client_secret_arn
  tls_secret_arn         = var.tls_secret_arns["function"]
  bucket_arn             = module.storage.bucket_arn
  prefix                 = module.storage.prefix
  kms_key_arn            = module.storage.kms_key_arn
  subnet_ids             = module.network.private_subnet_ids
  security_group_ids     = [module.network.security_group_ids["functions"]]
  reserved_concurrency   = var.function_concurrency
  tags                   = local.tags
}

module "cluster" {
  source                    = "../../modules/cluster"
  name                      = local.name
  image_uri                 = var.image_uri
  store_url                 = module.storage.store_url
  cluster_url               = module.etcd.client_url
  etcd_tls_dir              = module.etcd.client_tls_dir
  etcd_client_secret_arn    = var.etcd_client_secret_arn
  tls_secret_arns           = var.tls_secret_arns
  bucket_policy_arn         = module.storage.read_write_policy_arn
  invoke_policy_json        = module.functions.invoke_policy_json
  log_sort_function         = module.functions.function_names["log_sort"]
  compaction_function       = module.functions.function_names["compaction"]
  subnet_ids                = module.network.private_subnet_ids
  master_security_group_id  = module.network.security_group_ids["master"]
  worker_security_group_id  = module.network.security_group_ids["workers"]
  clients_security_group_id = module.network.security_group_ids["clients"]
  kms_key_arn               = module.storage.kms_key_arn
  workers_min               = var.workers_min
  workers_max               = var.workers_max
  replace_all_at_once       = var.replace_all_at_once
  replication = {
    source_url                    = var.source_cluster_url
    source_etcd_tls_dir           = local.source_etcd_tls_dir
    source_etcd_client_secret_arn = var.source_etcd_client_secret_arn
    source_bucket_arn             = var.source_bucket_arn
    source_prefix                 = var.source_prefix
    source_kms_key_arn            = var.source_kms_key_arn
    tables                        = var.replicated_tables
  }
  tags = local.tags
}

module "alarms" {
  source            = "../../modules/alarms"
  name              = local.name
  kms_key_arn       = module.storage.kms_key_arn
  alarm_email       = var.alarm_email
  bucket            = module.storage.bucket
  prefix            = module.storage.prefix
  ecs_cluster_name  = module.cluster.ecs_cluster_name
  master_service    = module.cluster.services["master"]
  worker_service    = module.cluster.services["worker"]
  workers_min       = var.workers_min
  functions         = module.functions.function_names
  dead_letter_queue = module.functions.dead_letter_queue
  etcd_members      = module.etcd.member_names
  etcd_quota_bytes  = module.etcd.quota_bytes
  tags              = local.tags
}
