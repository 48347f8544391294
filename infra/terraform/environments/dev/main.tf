# The dev deployment of tabletstore: bucket, network, etcd, cluster and functions.
#   terraform init && terraform apply -var-file=dev.tfvars
#   tabletstore --url "$(terraform output -raw cluster_url)" ls     (through an etcd proxy)

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = { project = "tabletstore", environment = "dev" }
  }
}

locals {
  name = "dev"
  tags = { project = "tabletstore", environment = "dev" }
}

module "storage" {
  source        = "../../modules/bucket"
  name          = local.name
  bucket_name   = var.bucket_name
  prefix        = "dev/"
  force_destroy = true
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
  source            = "../../modules/etcd"
  name              = local.name
  subnet_ids        = module.network.private_subnet_ids
  security_group_id = module.network.security_group_ids["etcd"]
  ami_id            = var.etcd_ami_id
  instance_type     = var.etcd_instance_type
  image_uri         = var.image_uri
  ca_secret_arn     = var.etcd_ca_secret_arn
  kms_key_arn       = module.storage.kms_key_arn
  tags              = local.tags
}

module "functions" {
  source               = "../../modules/functions"
  name                 = local.name
  image_uri            = var.image_uri
  store_url            = module.storage.store_url
  bucket_arn           = module.storage.bucket_arn
  prefix               = module.storage.prefix
  kms_key_arn          = module.storage.kms_key_arn
  subnet_ids           = module.network.private_subnet_ids
  security_group_ids   = [module.network.security_group_ids["functions"]]
  reserved_concurrency = var.function_concurrency
  tags                 = local.tags
}

module "cluster" {
  source                   = "../../modules/cluster"
  name                     = local.name
  image_uri                = var.image_uri
  store_url                = module.storage.store_url
  etcd_url                 = module.etcd.etcd_url
  etcd_client_secret_arn   = var.etcd_client_secret_arn
  bucket_policy_arn        = module.storage.read_write_policy_arn
  invoke_policy_json       = module.functions.invoke_policy_json
  environment              = module.functions.executor_environment
  subnet_ids               = module.network.private_subnet_ids
  master_security_group_id = module.network.security_group_ids["master"]
  worker_security_group_id = module.network.security_group_ids["workers"]
  kms_key_arn              = module.storage.kms_key_arn
  workers_min              = var.workers_min
  workers_max              = var.workers_max
  tags                     = local.tags
}
