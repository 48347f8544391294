# The object store of one tabletstore deployment (DESIGN.md §3): SSTables, commit-log segments,
# recovery runs and snapshots live under one prefix of one bucket. Objects are immutable and
# created with conditional PUTs (If-None-Match: *), so versioning adds nothing but cost; garbage
# collection is tabletstore's own (mark and sweep from METADATA), not a lifecycle rule.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

resource "aws_s3_bucket" "objects" {
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  tags          = var.tags
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
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn != null
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "objects" {
  bucket = aws_s3_bucket.objects.id
  # tabletstore never uses multipart uploads for its objects today; a client that dies in one
  # must not leave parts behind forever.
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {
      prefix = var.prefix
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

# What a worker, master or batch job needs: read, create, list and delete objects under the
# prefix. (Deleting is the master's garbage collector; a read-only batch job can use
# aws_iam_policy.reader instead.)
data "aws_iam_policy_document" "read_write" {
  statement {
    sid       = "ListPrefix"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.objects.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.prefix}*"]
    }
  }
  statement {
    sid       = "Objects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.objects.arn}/${var.prefix}*"]
  }
}

data "aws_iam_policy_document" "read_only" {
  statement {
    sid       = "ListPrefix"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.objects.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.prefix}*"]
    }
  }
  statement {
    sid       = "ReadObjects"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.objects.arn}/${var.prefix}*"]
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
