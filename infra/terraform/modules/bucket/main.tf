# The object store of one tabletstore deployment (the paper's GFS, §4): SSTables, commit-log
# segments, recovery runs and snapshots live under one prefix of one bucket; the etcd members'
# snapshots under etcd-snapshots/ beside it.
#
# Versioning is on, with noncurrent versions expired after var.noncurrent_version_days.
# tabletstore never overwrites an object (every PUT is create-only, If-None-Match: *), so the
# only noncurrent versions are objects garbage collection deleted: a GC that deleted too much
# (a bug, a wrong grace period, an etcd restored to an older snapshot that still references
# them) is undone by removing the delete markers within that window. The cost is the deleted
# bytes kept that many days.
#
# One key (the module's KMS key) encrypts the objects, the deployment's CloudWatch log groups,
# the dead-letter queue, the functions' environment and the alarm topic. Its policy names every
# AWS service that uses it on the deployment's behalf (CloudWatch Logs, CloudWatch alarms
# publishing to the encrypted topic); the roles that use it get kms:Decrypt etc. through their
# own IAM policies, which the account statement enables. The etcd members' EBS volumes use it
# too: the data volumes are created by Terraform and attached by the member's role (IAM
# grants), and their root volumes use the AWS-managed EBS key, so the Auto Scaling
# service-linked role (which launches them) needs no grant in this policy -- a key policy
# cannot name that role before it exists, and it does not exist in a fresh account until the
# first auto-scaling group is made.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  etcd_snapshot_prefix = "etcd-snapshots/"
  account              = data.aws_caller_identity.current.account_id
  arn                  = "arn:${data.aws_partition.current.partition}"
  region               = data.aws_region.current.name
  # The CloudWatch log groups this key encrypts: every group of the deployment is named so
  # (network: /tabletstore/NAME/vpc-flow, cluster: /tabletstore/NAME/cluster, functions:
  # /aws/lambda/NAME-tabletstore-*).
  log_group_arns = [
    "${local.arn}:logs:${local.region}:${local.account}:log-group:/tabletstore/${var.name}/*",
    "${local.arn}:logs:${local.region}:${local.account}:log-group:/aws/lambda/${var.name}-tabletstore-*",
  ]
}

# The bucket's key: every object (and every access log) is encrypted with it.
resource "aws_kms_key" "objects" {
  description             = "tabletstore ${var.name}: objects in s3://${var.bucket_name}"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
  tags                    = var.tags
}

data "aws_iam_policy_document" "key" {
  # checkov:skip=CKV_AWS_109:A key policy's "*" resource is this key; the account root administering it is AWS's default key policy, and use is granted by IAM policies.
  # checkov:skip=CKV_AWS_111:Same: the key policy names only this key and only the account's own principals.
  # checkov:skip=CKV_AWS_356:In a key policy "*" means this key alone.
  # The account administers the key; the roles that use it get kms:Decrypt etc. through
  # their own IAM policies (read_write / read_only below), which this statement enables.
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["${local.arn}:iam::${local.account}:root"]
    }
  }
  # CloudWatch Logs encrypts the deployment's log groups with this key itself (CreateLogGroup
  # with kmsKeyId fails without this statement); the encryption context names the group.
  statement {
    sid = "CloudWatchLogsEncryptsTheDeploymentsLogGroups"
    actions = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = local.log_group_arns
    }
  }
  # CloudWatch alarms publish to the deployment's encrypted SNS topic (the alarms module): the
  # statement AWS documents for alarms and an SSE topic (SNS calls KMS as the publisher).
  statement {
    sid       = "CloudWatchAlarmsPublishToTheEncryptedTopic"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["cloudwatch.amazonaws.com"]
    }
  }
}

resource "aws_kms_alias" "objects" {
  name          = "alias/tabletstore-${var.name}"
  target_key_id = aws_kms_key.objects.key_id
}

resource "aws_s3_bucket" "objects" {
  # checkov:skip=CKV_AWS_144:Cross-region replication is a deployment choice (cost, region); a replica of a live bucket without its etcd is not a usable copy. Use tabletstore snapshots.
  # checkov:skip=CKV2_AWS_62:No consumer of S3 event notifications: tabletstore learns of objects from METADATA, not events.
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_versioning" "objects" {
  bucket = aws_s3_bucket.objects.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_public_access_block" "objects" {
  bucket                  = aws_s3_bucket.objects.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "objects" {
  bucket = aws_s3_bucket.objects.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "objects" {
  bucket = aws_s3_bucket.objects.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.objects.arn
    }
    bucket_key_enabled = true
  }
}

# TLS only: a request over plain HTTP is denied whoever makes it.
data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.objects.arn, "${aws_s3_bucket.objects.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "objects" {
  bucket = aws_s3_bucket.objects.id
  policy = data.aws_iam_policy_document.bucket.json
  # The public access block must exist first, or S3 may reject a policy update racing it.
  depends_on = [aws_s3_bucket_public_access_block.objects]
}

resource "aws_s3_bucket_lifecycle_configuration" "objects" {
  bucket = aws_s3_bucket.objects.id
  # Versioning first: a noncurrent-version rule on a bucket not yet versioned is refused.
  depends_on = [aws_s3_bucket_versioning.objects]
  # What GC deleted stays recoverable this long (module header), then goes; so do the delete
  # markers left with no version behind them.
  rule {
    id     = "expire-deleted-objects"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_days
    }
    expiration {
      expired_object_delete_marker = true
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
  # The etcd members' hourly snapshots (the etcd module's timer) are kept this long.
  rule {
    id     = "expire-etcd-snapshots"
    status = "Enabled"
    filter {
      prefix = local.etcd_snapshot_prefix
    }
    expiration {
      days = var.etcd_snapshot_days
    }
    noncurrent_version_expiration {
      noncurrent_days = 1
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
  # The open-time probe (storage_s3/s3.py) deletes its object at once; one left by a process
  # that died mid-probe is expired here.
  rule {
    id     = "expire-probes"
    status = "Enabled"
    filter {
      prefix = "${var.prefix}probes/"
    }
    expiration {
      days = 1
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

# Access logs go to a bucket of their own (a bucket cannot log to itself usefully).
resource "aws_s3_bucket" "logs" {
  # checkov:skip=CKV_AWS_18:This is the access-log bucket; logging it would log the logs.
  # checkov:skip=CKV_AWS_21:Log objects are written once by S3's log delivery; versions add nothing.
  # checkov:skip=CKV_AWS_144:Replicating access logs is a compliance choice left to the deployment.
  # checkov:skip=CKV2_AWS_62:Nothing consumes events of the access-log bucket.
  # checkov:skip=CKV_AWS_145:S3 server access log delivery supports only SSE-S3 (AES256) on the target bucket.
  bucket        = "${var.bucket_name}-access-logs"
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_public_access_block" "logs" {
  bucket                  = aws_s3_bucket.logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

# S3's log delivery writes with this grant (the bucket owner enforces ownership, so ACL grants
# would be ignored); plain HTTP is denied here too. The grant comes first and the deny names
# {"AWS": "*"} (the same as "*" to S3): moto 5.2's check of a log target's policy stops at the
# first statement that grants log delivery and cannot read a bare "*" principal.
data "aws_iam_policy_document" "logs" {
  statement {
    sid       = "S3LogDelivery"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/s3/${var.bucket_name}/*"]
    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = [aws_s3_bucket.objects.arn]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.logs.arn, "${aws_s3_bucket.logs.arn}/*"]
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

resource "aws_s3_bucket_policy" "logs" {
  bucket     = aws_s3_bucket.logs.id
  policy     = data.aws_iam_policy_document.logs.json
  depends_on = [aws_s3_bucket_public_access_block.logs]
}

resource "aws_s3_bucket_server_side_encryption_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id
  rule {
    id     = "expire-access-logs"
    status = "Enabled"
    filter {}
    expiration {
      days = var.access_log_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "aws_s3_bucket_logging" "objects" {
  bucket        = aws_s3_bucket.objects.id
  target_bucket = aws_s3_bucket.logs.id
  target_prefix = "s3/${var.bucket_name}/"
  depends_on    = [aws_s3_bucket_policy.logs]
}

# What a worker or master needs: read, create, list and delete objects under the prefix
# (deleting is the master's garbage collector), with the bucket's key.
#
# s3:ListBucket has no prefix condition: every process checks the bucket at start with
# HeadBucket (storage_s3/s3.py), which S3 authorizes as s3:ListBucket on the bucket with no
# s3:prefix, and IAM cannot tell that call from a listing without a prefix. The bucket is this
# deployment's own (one bucket per environment), so the names outside the prefix are the
# etcd snapshots' and nothing else's; reading, writing and deleting stay under the prefix.
data "aws_iam_policy_document" "read_write" {
  statement {
    sid       = "HeadBucketAndList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.objects.arn]
  }
  statement {
    sid       = "Objects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.objects.arn}/${var.prefix}*"]
  }
  statement {
    sid       = "Key"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.objects.arn]
  }
}

# What a batch job that reads SSTables straight from the bucket needs (HeadBucket included,
# as above).
data "aws_iam_policy_document" "read_only" {
  statement {
    sid       = "HeadBucketAndList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.objects.arn]
  }
  statement {
    sid       = "ReadObjects"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.objects.arn}/${var.prefix}*"]
  }
  statement {
    sid       = "Key"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.objects.arn]
  }
}

resource "aws_iam_policy" "read_write" {
  name   = "${var.name}-tabletstore-read-write"
  policy = data.aws_iam_policy_document.read_write.json
  tags   = var.tags
}

resource "aws_iam_policy" "reader" {
  name   = "${var.name}-tabletstore-read-only"
  policy = data.aws_iam_policy_document.read_only.json
  tags   = var.tags
}
