# The Terraform state of the environments: one S3 bucket (versioned, encrypted, TLS only) and
# one DynamoDB lock table, made once per account with local state (keep this root's
# terraform.tfstate, or import the two resources again later). Its backend_hcl output is the
# environments' backend configuration:
#   cd infra/terraform/bootstrap && terraform init && terraform apply -var region=... -var state_bucket=...
#   terraform output -raw backend_hcl > ../environments/prod/backend.hcl
#   cd ../environments/prod && terraform init -backend-config=backend.hcl

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
    tags = { project = "tabletstore", environment = "terraform-state" }
  }
}

variable "region" {
  description = "AWS region of the state bucket and lock table."
  type        = string
}

variable "state_bucket" {
  description = "Name of the state bucket (globally unique)."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.state_bucket))
    error_message = "state_bucket must be 3-63 lowercase letters, digits, '.' or '-' (S3's rules)."
  }
}

variable "lock_table" {
  type    = string
  default = "tabletstore-terraform-locks"
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

data "aws_iam_policy_document" "key" {
  # checkov:skip=CKV_AWS_109:A key policy's "*" resource is this key; the account root administering it is AWS's default key policy.
  # checkov:skip=CKV_AWS_111:Same: the key policy names only this key and only the account's own principals.
  # checkov:skip=CKV_AWS_356:In a key policy "*" means this key alone.
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "state" {
  description             = "tabletstore Terraform state"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
}

resource "aws_s3_bucket" "state" {
  # checkov:skip=CKV_AWS_18:Access logging of the state bucket would need a log bucket of its own; CloudTrail records who read or wrote the state.
  # checkov:skip=CKV_AWS_144:Cross-region replication of the state is a disaster-recovery choice left to the account; versioning keeps every past state.
  # checkov:skip=CKV2_AWS_62:Nothing consumes events of the state bucket.
  bucket = var.state_bucket
  lifecycle {
    prevent_destroy = true
  }
}

resource "aws_s3_bucket_versioning" "state" {
  bucket = aws_s3_bucket.state.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "state" {
  bucket = aws_s3_bucket.state.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.state.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "state" {
  bucket                  = aws_s3_bucket.state.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_lifecycle_configuration" "state" {
  bucket     = aws_s3_bucket.state.id
  depends_on = [aws_s3_bucket_versioning.state]
  rule {
    id     = "keep-past-states-a-year"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = 365
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

data "aws_iam_policy_document" "state" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.state.arn, "${aws_s3_bucket.state.arn}/*"]
    principals {
      type        = "AWS"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "state" {
  bucket     = aws_s3_bucket.state.id
  policy     = data.aws_iam_policy_document.state.json
  depends_on = [aws_s3_bucket_public_access_block.state]
}

resource "aws_dynamodb_table" "locks" {
  name         = var.lock_table
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "LockID"
  attribute {
    name = "LockID"
    type = "S"
  }
  point_in_time_recovery {
    enabled = true
  }
  server_side_encryption {
    enabled     = true
    kms_key_arn = aws_kms_key.state.arn
  }
  deletion_protection_enabled = true
}

output "backend_hcl" {
  description = "The environments' backend configuration (terraform init -backend-config=backend.hcl)."
  value       = <<-HCL
    bucket         = "${aws_s3_bucket.state.id}"
    region         = "${var.region}"
    dynamodb_table = "${aws_dynamodb_table.locks.name}"
    kms_key_id     = "${aws_kms_key.state.arn}"
  HCL
}
