# A development deployment of tabletstore's storage tier: one bucket and its IAM policies.
# Usage:
#   terraform init
#   terraform apply -var bucket_name=my-tabletstore-dev
#   tabletstore --url etcd://ETCD:2379/dev master --store "$(terraform output -raw store_url)"

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

variable "region" {
  type    = string
  default = "us-east-1"
}

variable "bucket_name" {
  type = string
}

provider "aws" {
  region = var.region
}

module "storage" {
  source        = "../../modules/bucket"
  name          = "dev"
  bucket_name   = var.bucket_name
  prefix        = "dev/"
  force_destroy = true
  tags = {
    project     = "tabletstore"
    environment = "dev"
  }
}

output "store_url" {
  value = module.storage.store_url
}

output "read_write_policy_arn" {
  value = module.storage.read_write_policy_arn
}

output "read_only_policy_arn" {
  value = module.storage.read_only_policy_arn
}
