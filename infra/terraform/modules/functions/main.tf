# The serverless functions of the recovery path (docs/architecture/design.md §1; the paper's §5.2 recovery, with
# the sorting of §6): log sorting, compaction and garbage collection, handlers in functions/.
#
# They run from the project's one container image (Dockerfile): image_config's command is
# `function <handler>`, the entrypoint's `function` role, which starts the Lambda runtime
# interface client with that handler. So a function
# runs exactly the tabletstore the workers run, with pyarrow and every native dependency;
# a zip of the sources could not carry them (Lambda's 250 MB unzipped limit).
#
# Each function gets a role that reaches only the bucket prefixes its handler touches (the
# key layout is storage_s3/layout.py), reserved concurrency so a recovery storm cannot starve
# the account, a dead-letter queue, tracing, and the VPC's private subnets (the functions
# security group reaches etcd and the workers). The master invokes log sorting and
# compaction (its --sort-executor and --compaction-executor; the events carry the store and
# cluster URLs); an EventBridge rule invokes garbage collection on var.gc_schedule with the
# cluster URL. The functions that open the cluster's etcd (compaction, gc) read the etcd
# client certificate from Secrets Manager at their start (TABLETSTORE_ETCD_CLIENT_SECRET,
# functions/etcd_tls.py) and write it where the URL's ?ca=&cert=&key= name it, under /tmp;
# and the function role's RPC certificate (TABLETSTORE_TLS_SECRET) where TABLETSTORE_TLS_CA,
# _CERT and _KEY name it, with which they reach the workers' TLS ports.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

locals {
  prefix = var.prefix
  # Known at plan time (the master's command names them; the plan is what tests read).
  function_names = { for kind in keys(local.functions) : kind => "${var.name}-tabletstore-${replace(kind, "_", "-")}" }
  # What each handler reads, writes and deletes, by key prefix (storage_s3/layout.py).
  functions = {
    # Sorts a dead worker's log segments into runs; a retried task reads the runs and
    # manifest it wrote before.
    log_sort = {
      handler = "functions.log_sort.handler"
      read    = ["logs/", "recovery/"]
      write   = ["recovery/"]
      delete  = []
      list    = ["logs/", "recovery/"]
      memory  = var.log_sort_memory_mb
      etcd    = false
    }
    # Reads a tablet's SSTables (bulk-loaded ones too: tables/<id>/bulk/), writes the merged ones.
    compaction = {
      handler = "functions.compaction.handler"
      read    = ["tables/"]
      write   = ["tables/"]
      delete  = []
      list    = ["tables/"]
      memory  = var.compaction_memory_mb
      etcd    = true
    }
    # Lists the whole prefix (master/gc.py lists "" under it), reads snapshot manifests (they
    # pin SSTables), deletes what nothing references.
    gc = {
      handler = "functions.gc.handler"
      read    = ["snapshots/"]
      write   = []
      delete  = ["tables/", "logs/", "recovery/"]
      list    = [""]
      memory  = 512
      etcd    = true
    }
  }
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "function" {
  for_each           = local.functions
  name               = "${var.name}-tabletstore-${replace(each.key, "_", "-")}"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "function" {
  # checkov:skip=CKV_AWS_111:Only the VPC network-interface and X-Ray actions have "*": they accept no resource ARN (Lambda's own managed policy for VPC access is the same).
  # checkov:skip=CKV_AWS_356:Same statements: ec2 network-interface and xray actions cannot be scoped to a resource.
  for_each = local.functions
  statement {
    sid       = "List"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [for p in each.value.list : "${local.prefix}${p}*"]
    }
  }
  dynamic "statement" {
    for_each = length(each.value.read) > 0 ? [1] : []
    content {
      sid       = "Read"
      actions   = ["s3:GetObject"]
      resources = [for p in each.value.read : "${var.bucket_arn}/${local.prefix}${p}*"]
    }
  }
  dynamic "statement" {
    for_each = length(each.value.write) > 0 ? [1] : []
    content {
      sid       = "Create"
      actions   = ["s3:PutObject"]
      resources = [for p in each.value.write : "${var.bucket_arn}/${local.prefix}${p}*"]
    }
  }
  dynamic "statement" {
    for_each = length(each.value.delete) > 0 ? [1] : []
    content {
      sid       = "Delete"
      actions   = ["s3:DeleteObject"]
      resources = [for p in each.value.delete : "${var.bucket_arn}/${local.prefix}${p}*"]
    }
  }
  dynamic "statement" {
    for_each = each.value.etcd ? [1] : []
    content {
      sid       = "Certificates"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [var.etcd_client_secret_arn, var.tls_secret_arn]
    }
  }
  statement {
    sid       = "BucketKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
  }
  statement {
    sid       = "DeadLetters"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.dead_letters.arn]
  }
  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.function[each.key].arn}:*"]
  }
  statement {
    sid = "VpcNetworkInterfaces"
    # Lambda manages the ENIs of a function in a VPC; these actions take no resource ARN.
    actions = [
      "ec2:CreateNetworkInterface",
      "ec2:DescribeNetworkInterfaces",
      "ec2:DeleteNetworkInterface",
      "ec2:AssignPrivateIpAddresses",
      "ec2:UnassignPrivateIpAddresses",
    ]
    resources = ["*"]
  }
  statement {
    sid       = "Tracing"
    actions   = ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]
    resources = ["*"]
  }
}

resource "aws_iam_role_policy" "function" {
  for_each = local.functions
  name     = "least-privilege"
  role     = aws_iam_role.function[each.key].id
  policy   = data.aws_iam_policy_document.function[each.key].json
}

resource "aws_cloudwatch_log_group" "function" {
  for_each          = local.functions
  name              = "/aws/lambda/${var.name}-tabletstore-${replace(each.key, "_", "-")}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_sqs_queue" "dead_letters" {
  name                      = "${var.name}-tabletstore-function-dead-letters"
  kms_master_key_id         = var.kms_key_arn
  message_retention_seconds = 1209600
  tags                      = var.tags
}

resource "aws_lambda_function" "function" {
  # checkov:skip=CKV_AWS_272:Code signing applies to zip packages; these run a container image pinned by digest (var.image_uri).
  for_each      = local.functions
  function_name = local.function_names[each.key]
  role          = aws_iam_role.function[each.key].arn
  package_type  = "Image"
  image_uri     = var.image_uri
  image_config {
    command = ["function", each.value.handler]
  }
  memory_size                    = each.value.memory
  timeout                        = var.timeout_seconds
  reserved_concurrent_executions = var.reserved_concurrency
  kms_key_arn                    = var.kms_key_arn
  dynamic "environment" {
    for_each = each.value.etcd ? [1] : []
    content {
      variables = {
        TABLETSTORE_ETCD_CLIENT_SECRET = var.etcd_client_secret_arn
        TABLETSTORE_TLS_SECRET         = var.tls_secret_arn
        TABLETSTORE_TLS_CA             = "/tmp/tls/ca.pem"
        TABLETSTORE_TLS_CERT           = "/tmp/tls/cert.pem"
        TABLETSTORE_TLS_KEY            = "/tmp/tls/key.pem"
      }
    }
  }
  dead_letter_config {
    target_arn = aws_sqs_queue.dead_letters.arn
  }
  tracing_config {
    mode = "Active"
  }
  vpc_config {
    subnet_ids         = var.subnet_ids
    security_group_ids = var.security_group_ids
  }
  tags       = var.tags
  depends_on = [aws_iam_role_policy.function, aws_cloudwatch_log_group.function]
}

# Garbage collection on a schedule (the master also collects while it leads; two rounds at
# once are safe, functions/gc.py).
resource "aws_cloudwatch_event_rule" "gc" {
  name                = "${var.name}-tabletstore-gc"
  description         = "tabletstore ${var.name}: one garbage-collection round"
  schedule_expression = var.gc_schedule
  tags                = var.tags
}

resource "aws_cloudwatch_event_target" "gc" {
  rule  = aws_cloudwatch_event_rule.gc.name
  arn   = aws_lambda_function.function["gc"].arn
  input = jsonencode({ cluster_url = var.cluster_url })
}

resource "aws_lambda_permission" "gc_schedule" {
  statement_id  = "ScheduledGarbageCollection"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.function["gc"].function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.gc.arn
}
