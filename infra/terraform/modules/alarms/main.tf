# CloudWatch alarms for the signals tabletstore's Grafana dashboard (tabletstore/ops/grafana)
# shows, from the metrics AWS itself records, to one encrypted SNS topic (subscribe an address
# with var.alarm_email, or anything else to the topic_arn output):
#
#   dashboard                           alarm here
#   Processes, Master leading           master / worker tasks running (Container Insights)
#   Requests/s, latency (saturation)    workers' CPU above the autoscaler's reach
#   S3 errors/s by kind                 5xx answers of the bucket's prefix (S3 request metrics)
#   Log recovery, compactions, GC       errors and throttles of the three functions; messages
#                                       in their dead-letter queue
#   (etcd, Chubby's role)               each member's database size against its quota, a
#                                       member that stops reporting, a member's instance gone
#
# The per-method RPC latencies and the commit log's last PUT are Prometheus metrics of the
# processes (/metrics on the metrics port); alarming on those needs a Prometheus scraper in
# the VPC (docs/operations/cloud-deployment.md "Dashboards and alarms").

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

resource "aws_sns_topic" "alarms" {
  name              = "${var.name}-tabletstore-alarms"
  kms_master_key_id = var.kms_key_arn
  tags              = var.tags
}

resource "aws_sns_topic_subscription" "email" {
  count     = var.alarm_email == null ? 0 : 1
  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = var.alarm_email
}

# S3 request metrics for the deployment's prefix (4xx/5xx, latency, request counts).
resource "aws_s3_bucket_metric" "prefix" {
  bucket = var.bucket
  name   = "tabletstore"
  filter {
    prefix = var.prefix
  }
}

locals {
  actions = [aws_sns_topic.alarms.arn]
  services = {
    master = { service = var.master_service, minimum = 1 }
    worker = { service = var.worker_service, minimum = var.workers_min }
  }
}

resource "aws_cloudwatch_metric_alarm" "tasks_running" {
  for_each            = local.services
  alarm_name          = "${var.name}-tabletstore-${each.key}-tasks-running"
  alarm_description   = "Fewer ${each.key} tasks running than ${each.value.minimum} (dashboard: Processes, Master leading)."
  namespace           = "ECS/ContainerInsights"
  metric_name         = "RunningTaskCount"
  dimensions          = { ClusterName = var.ecs_cluster_name, ServiceName = each.value.service }
  statistic           = "Minimum"
  period              = 60
  evaluation_periods  = 5
  comparison_operator = "LessThanThreshold"
  threshold           = each.value.minimum
  treat_missing_data  = "breaching"
  alarm_actions       = local.actions
  ok_actions          = local.actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "worker_cpu" {
  alarm_name          = "${var.name}-tabletstore-worker-cpu"
  alarm_description   = "Workers' CPU stays high: the autoscaler is at its maximum or cannot keep up (dashboard: Requests/s, latency)."
  namespace           = "AWS/ECS"
  metric_name         = "CPUUtilization"
  dimensions          = { ClusterName = var.ecs_cluster_name, ServiceName = var.worker_service }
  statistic           = "Average"
  period              = 300
  evaluation_periods  = 3
  comparison_operator = "GreaterThanThreshold"
  threshold           = 85
  alarm_actions       = local.actions
  ok_actions          = local.actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "s3_errors" {
  alarm_name          = "${var.name}-tabletstore-s3-5xx"
  alarm_description   = "S3 answers 5xx to the deployment's requests (dashboard: S3 errors/s by kind)."
  namespace           = "AWS/S3"
  metric_name         = "5xxErrors"
  dimensions          = { BucketName = var.bucket, FilterId = aws_s3_bucket_metric.prefix.name }
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 2
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.s3_5xx_per_5_minutes
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.actions
  ok_actions          = local.actions
  tags                = var.tags
}

# Each function's errors (it failed) and throttles (it hit its reserved concurrency: recovery
# or compaction waits).
resource "aws_cloudwatch_metric_alarm" "function" {
  for_each            = { for pair in setproduct(keys(var.functions), ["Errors", "Throttles"]) : "${pair[0]}-${lower(pair[1])}" => { kind = pair[0], metric = pair[1] } }
  alarm_name          = "${var.functions[each.value.kind]}-${lower(each.value.metric)}"
  alarm_description   = "${each.value.metric} of the ${each.value.kind} function (dashboard: log recovery, compactions, GC)."
  namespace           = "AWS/Lambda"
  metric_name         = each.value.metric
  dimensions          = { FunctionName = var.functions[each.value.kind] }
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.actions
  ok_actions          = local.actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "dead_letters" {
  alarm_name          = "${var.name}-tabletstore-function-dead-letters"
  alarm_description   = "An asynchronous function invocation (the scheduled GC) failed every retry."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = var.dead_letter_queue }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.actions
  ok_actions          = local.actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "etcd_db_size" {
  for_each            = toset(var.etcd_members)
  alarm_name          = "${var.name}-tabletstore-${each.key}-db-size"
  alarm_description   = "etcd ${each.key}'s database is past 80% of its quota: past the quota etcd refuses writes (defragment, docs/operations/cloud-deployment.md)."
  namespace           = "tabletstore/etcd"
  metric_name         = "DbSizeBytes"
  dimensions          = { Deployment = var.name, Member = each.key }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = floor(var.etcd_quota_bytes * 0.8)
  treat_missing_data  = "missing"
  alarm_actions       = local.actions
  ok_actions          = local.actions
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "etcd_reporting" {
  for_each            = toset(var.etcd_members)
  alarm_name          = "${var.name}-tabletstore-${each.key}-silent"
  alarm_description   = "etcd ${each.key} has not reported its database size for 10 minutes: the member (or its instance) is down."
  namespace           = "tabletstore/etcd"
  metric_name         = "DbSizeBytes"
  dimensions          = { Deployment = var.name, Member = each.key }
  statistic           = "SampleCount"
  period              = 300
  evaluation_periods  = 2
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  treat_missing_data  = "breaching"
  alarm_actions       = local.actions
  ok_actions          = local.actions
  tags                = var.tags
}
