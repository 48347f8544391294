# What tests/unit/test_terraform.py applies and destroys against moto's server: the bucket, the
# network and the functions modules as the environments compose them (moto implements S3, KMS,
# IAM, Lambda, SQS, EventBridge, EC2's VPC pieces and CloudWatch Logs). The whole environments
# are planned against moto by tests/unit/test_terraform_cloud.py.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

variable "endpoint" {
  description = "moto's server, e.g. http://127.0.0.1:5000."
  type        = string
}

variable "bucket_name" {
  type = string
}

provider "aws" {
  region                      = "us-east-1"
  access_key                  = "testing"
  secret_key                  = "testing"
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
  s3_use_path_style           = true
  endpoints {
    ec2    = var.endpoint
    events = var.endpoint
    iam    = var.endpoint
    kms    = var.endpoint
    lambda = var.endpoint
    logs   = var.endpoint
    s3     = var.endpoint
    sqs    = var.endpoint
    sts    = var.endpoint
  }
}

module "storage" {
  source        = "../../modules/bucket"
  name          = "motocheck"
  bucket_name   = var.bucket_name
  prefix        = "db/"
  force_destroy = true
}

module "network" {
  source             = "../../modules/network"
  name               = "motocheck"
  availability_zones = ["us-east-1a", "us-east-1b", "us-east-1c"]
  kms_key_arn        = module.storage.kms_key_arn
}

module "functions" {
  source                 = "../../modules/functions"
  name                   = "motocheck"
  image_uri              = "123456789012.dkr.ecr.us-east-1.amazonaws.com/tabletstore:test"
  cluster_url            = "etcd://10.40.0.10:2379/tabletstore?ca=/tmp/etcd-tls/ca.pem&cert=/tmp/etcd-tls/client.pem&key=/tmp/etcd-tls/client.key"
  etcd_client_secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:client"
  tls_secret_arn         = "arn:aws:secretsmanager:us-east-1:123456789012:secret:tls-function"
  bucket_arn             = module.storage.bucket_arn
  prefix                 = module.storage.prefix
  kms_key_arn            = module.storage.kms_key_arn
  subnet_ids             = module.network.private_subnet_ids
  security_group_ids     = [module.network.security_group_ids["functions"]]
}

output "store_url" {
  value = module.storage.store_url
}

output "functions" {
  value = module.functions.function_names
}

output "function_arns" {
  value = module.functions.function_arns
}
