# The tabletstore cluster (the paper's §5: one master, many tablet servers) as ECS services on
# Fargate, all from the one container image: two masters (the second campaigns for the master
# lock and stands by, §5.2), and workers that scale on CPU; and a one-off `cli` task, the way in
# from outside the VPC (`aws ecs run-task` with a tabletstore command: docs/operations/
# cloud-deployment.md "Reaching the cluster").
#
# Fargate runs each container with a read-only root file system as the image's user (not
# root): the only writable path is the task's scratch volume, mounted at /tmp (TMPDIR,
# TABLETSTORE_HEALTH_FILE, the workers' sort spill directory, the etcd client certificate).
# Fargate makes such a volume root-owned and 0755, so a short init container running as root
# (`scratch`) makes it 1777 and writes the etcd client certificate (from Secrets Manager)
# where the cluster URL's ?ca=&cert=&key= name it, and the task's RPC certificate (master,
# worker or client: var.tls_secret_arns) to /tmp/tls, owned by the image's user; the process
# container starts when it has exited successfully. Masters and workers serve their RPC and
# status ports with mutual TLS from it.
#
# The master runs the recovery functions: --sort-executor and --compaction-executor name the
# functions module's log-sort and compaction functions.
#
# With var.replication this cluster is a replica of tables of a source cluster (another
# region): a `replicator` service of one task follows them (`tabletstore replicate`). Its task
# role is its own and may only read the source's bucket (list it, get the objects under its
# prefix, decrypt with its key): it writes the replica through this cluster's workers, as a
# client, so it needs nothing of this cluster's bucket. Its init container also writes the
# source's etcd client certificate where the source URL names it. One task at a time (a
# deployment stops the old one first): two would write the same progress records.
#
# The entrypoint binds each process to the task's own address (which it then advertises in etcd;
# 0.0.0.0 cannot be dialled), and its `health` role is the health check: a TCP connect to the
# process's RPC port on that address.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

data "aws_region" "current" {}

locals {
  # ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO[:TAG|@DIGEST] -> the repository's ARN.
  image_parts    = regex("^([0-9]{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com[a-z.]*/([^:@]+)", var.image_uri)
  repository_arn = "arn:aws:ecr:${local.image_parts[1]}:${local.image_parts[0]}:repository/${local.image_parts[2]}"
  log_options = {
    awslogs-group         = aws_cloudwatch_log_group.cluster.name
    awslogs-region        = data.aws_region.current.name
    awslogs-stream-prefix = "tabletstore"
  }
  user        = "${var.image_uid}:${var.image_uid}"
  health_file = "/tmp/tabletstore-health"
  # The RPC ports serve mutual TLS: each task's init container writes its role's certificate
  # (var.tls_secret_arns: the cluster CA, the certificate, its key) to tls_dir, and the
  # process reads it from there (TABLETSTORE_TLS_CA/_CERT/_KEY).
  tls_dir     = "/tmp/tls"
  replicating = var.replication != null
  tls_role = merge(
    { master = "master", worker = "worker", cli = "client" },
    local.replicating ? { replicator = "client" } : {},
  )
  # The replicator's scratch also writes the source's etcd client certificate.
  source_cert_lines = local.replicating ? [
    "mkdir -p ${var.replication.source_etcd_tls_dir}",
    "printf '%s\\n' \"$SOURCE_ETCD_CA_CERT\" > ${var.replication.source_etcd_tls_dir}/ca.pem",
    "printf '%s\\n' \"$SOURCE_ETCD_CLIENT_CERT\" > ${var.replication.source_etcd_tls_dir}/client.pem",
    "printf '%s\\n' \"$SOURCE_ETCD_CLIENT_KEY\" > ${var.replication.source_etcd_tls_dir}/client.key",
    "chown -R ${local.user} ${var.replication.source_etcd_tls_dir}",
  ] : []
  source_cert_secrets = local.replicating ? [
    { name = "SOURCE_ETCD_CLIENT_CERT", valueFrom = "${var.replication.source_etcd_client_secret_arn}:cert::" },
    { name = "SOURCE_ETCD_CLIENT_KEY", valueFrom = "${var.replication.source_etcd_client_secret_arn}:key::" },
    { name = "SOURCE_ETCD_CA_CERT", valueFrom = "${var.replication.source_etcd_client_secret_arn}:ca::" },
  ] : []
  # The init container: /tmp writable by all (sticky), the etcd client certificate in
  # var.etcd_tls_dir and the task's RPC certificate in tls_dir, readable by the image's user
  # alone.
  scratch = { for task, role in local.tls_role : task => {
    name       = "scratch"
    image      = var.image_uri
    essential  = false
    user       = "0"
    entryPoint = ["/bin/sh", "-c"]
    command = [join("; ", concat([
      "set -eu",
      "chmod 1777 /tmp",
      "umask 077",
      "mkdir -p ${var.etcd_tls_dir} ${local.tls_dir}",
      "printf '%s\\n' \"$ETCD_CA_CERT\" > ${var.etcd_tls_dir}/ca.pem",
      "printf '%s\\n' \"$ETCD_CLIENT_CERT\" > ${var.etcd_tls_dir}/client.pem",
      "printf '%s\\n' \"$ETCD_CLIENT_KEY\" > ${var.etcd_tls_dir}/client.key",
      "printf '%s\\n' \"$TLS_CA_PEM\" > ${local.tls_dir}/ca.pem",
      "printf '%s\\n' \"$TLS_CERT_PEM\" > ${local.tls_dir}/cert.pem",
      "printf '%s\\n' \"$TLS_KEY_PEM\" > ${local.tls_dir}/key.pem",
      "chown -R ${local.user} ${var.etcd_tls_dir} ${local.tls_dir}",
    ], task == "replicator" ? local.source_cert_lines : []))]
    secrets = concat(task == "replicator" ? local.source_cert_secrets : [], [
      { name = "ETCD_CLIENT_CERT", valueFrom = "${var.etcd_client_secret_arn}:cert::" },
      { name = "ETCD_CLIENT_KEY", valueFrom = "${var.etcd_client_secret_arn}:key::" },
      { name = "ETCD_CA_CERT", valueFrom = "${var.etcd_client_secret_arn}:ca::" },
      { name = "TLS_CA_PEM", valueFrom = "${var.tls_secret_arns[role]}:ca::" },
      { name = "TLS_CERT_PEM", valueFrom = "${var.tls_secret_arns[role]}:cert::" },
      { name = "TLS_KEY_PEM", valueFrom = "${var.tls_secret_arns[role]}:key::" },
    ])
    readonlyRootFilesystem = true
    mountPoints            = [{ sourceVolume = "scratch", containerPath = "/tmp" }]
    logConfiguration       = { logDriver = "awslogs", options = local.log_options }
  } }
  # AWS_DEFAULT_REGION: the region of boto3's Lambda client (the master's executors); the store
  # URL names its own.
  environment = [for k, v in {
    TABLETSTORE_URL         = var.cluster_url
    TABLETSTORE_HEALTH_FILE = local.health_file
    TABLETSTORE_TLS_CA      = "${local.tls_dir}/ca.pem"
    TABLETSTORE_TLS_CERT    = "${local.tls_dir}/cert.pem"
    TABLETSTORE_TLS_KEY     = "${local.tls_dir}/key.pem"
    AWS_DEFAULT_REGION      = data.aws_region.current.name
  } : { name = k, value = v }]
  # The RPC and status ports serve mutual TLS with the role's certificate (TABLETSTORE_TLS_*).
  roles = {
    master = {
      command = [
        "master", "--store", var.store_url, "--port", tostring(var.master_port),
        "--metrics-port", tostring(var.metrics_port),
        "--sort-executor", "lambda:${var.log_sort_function}",
        "--compaction-executor", "lambda:${var.compaction_function}",
      ]
      port   = var.master_port
      cpu    = var.master_cpu
      memory = var.master_memory
    }
    worker = {
      command = ["worker", "--port", tostring(var.worker_port), "--metrics-port", tostring(var.metrics_port)]
      port    = var.worker_port
      cpu     = var.worker_cpu
      memory  = var.worker_memory
    }
  }
  tasks = merge(
    local.roles,
    { cli = { command = ["status"], port = null, cpu = 512, memory = 1024 } },
    local.replicating ? {
      replicator = {
        command = concat(["replicate", "--source", var.replication.source_url], var.replication.tables)
        port    = null
        cpu     = 1024
        memory  = 2048
      }
    } : {},
  )
}

resource "aws_cloudwatch_log_group" "cluster" {
  name              = "/tabletstore/${var.name}/cluster"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_ecs_cluster" "main" {
  name = "${var.name}-tabletstore"
  setting {
    name  = "containerInsights"
    value = "enabled"
  }
  tags = var.tags
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

# The task role: the bucket (read-write policy of the bucket module) and the functions.
# (The etcd client certificate reaches the tasks through the execution role, as secrets.)
resource "aws_iam_role" "task" {
  name               = "${var.name}-tabletstore-task"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "task_bucket" {
  role       = aws_iam_role.task.name
  policy_arn = var.bucket_policy_arn
}

resource "aws_iam_role_policy" "task_functions" {
  name   = "invoke-functions"
  role   = aws_iam_role.task.id
  policy = var.invoke_policy_json
}

# The execution role: pull the image, write logs, read the etcd client certificate.
resource "aws_iam_role" "execution" {
  name               = "${var.name}-tabletstore-execution"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "execution" {
  # checkov:skip=CKV_AWS_356:ecr:GetAuthorizationToken accepts no resource ARN; the image pull itself is limited to the image's repository.
  statement {
    sid       = "RegistryLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }
  statement {
    sid       = "PullImage"
    actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    resources = [local.repository_arn]
  }
  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.cluster.arn}:*"]
  }
  statement {
    sid     = "Certificates"
    actions = ["secretsmanager:GetSecretValue"]
    resources = distinct(concat(
      [var.etcd_client_secret_arn],
      [for task, role in local.tls_role : var.tls_secret_arns[role]],
      local.replicating ? [var.replication.source_etcd_client_secret_arn] : [],
    ))
  }
  statement {
    sid       = "Key"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
  }
}

resource "aws_iam_role_policy" "execution" {
  name   = "execution"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

# The master, the workers and `cli`: a one-off tabletstore command inside the VPC (the
# clients' security group), `aws ecs run-task ... --overrides '{"containerOverrides":[{"name":
# "cli","command":["ls"]}]}'` (the cli_run_task output prints the whole command).
resource "aws_ecs_task_definition" "role" {
  for_each                 = local.tasks
  family                   = "${var.name}-tabletstore-${each.key}"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = each.value.cpu
  memory                   = each.value.memory
  task_role_arn            = each.key == "replicator" ? aws_iam_role.replicator[0].arn : aws_iam_role.task.arn
  execution_role_arn       = aws_iam_role.execution.arn
  container_definitions = jsonencode([
    merge(
      {
        name                   = each.key
        image                  = var.image_uri
        essential              = true
        user                   = local.user
        command                = each.value.command
        environment            = local.environment
        dependsOn              = [{ containerName = "scratch", condition = "SUCCESS" }]
        readonlyRootFilesystem = true
        mountPoints            = [{ sourceVolume = "scratch", containerPath = "/tmp" }]
        logConfiguration       = { logDriver = "awslogs", options = local.log_options }
      },
      # A serving process: its ports, and the entrypoint's health check on its RPC port.
      each.value.port == null ? null : {
        portMappings = [{ containerPort = each.value.port, protocol = "tcp" }, { containerPort = var.metrics_port, protocol = "tcp" }]
        healthCheck = {
          command     = ["CMD", "/usr/local/bin/tabletstore-entrypoint", "health", tostring(each.value.port)]
          interval    = 10
          retries     = 3
          timeout     = 5
          startPeriod = 60
        }
      },
    ),
    local.scratch[each.key],
  ])
  volume {
    name = "scratch"
  }
  tags = var.tags
}

resource "aws_ecs_service" "master" {
  name                   = "${var.name}-tabletstore-master"
  cluster                = aws_ecs_cluster.main.id
  task_definition        = aws_ecs_task_definition.role["master"].arn
  desired_count          = 2 # one leads, one stands by (§5.2)
  launch_type            = "FARGATE"
  enable_execute_command = false
  # A release whose wire protocol peers of the previous one refuse is deployed with
  # replace_all_at_once: every old task stops before a new one starts (no mixed versions).
  deployment_minimum_healthy_percent = var.replace_all_at_once ? 0 : 50
  deployment_maximum_percent         = var.replace_all_at_once ? 100 : 200
  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [var.master_security_group_id]
    assign_public_ip = false
  }
  tags = var.tags
}

resource "aws_ecs_service" "replicator" {
  count                  = local.replicating ? 1 : 0
  name                   = "${var.name}-tabletstore-replicator"
  cluster                = aws_ecs_cluster.main.id
  task_definition        = aws_ecs_task_definition.role["replicator"].arn
  desired_count          = 1
  launch_type            = "FARGATE"
  enable_execute_command = false
  # Never two at once: the old task stops before the new one starts.
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100
  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [var.clients_security_group_id]
    assign_public_ip = false
  }
  tags = var.tags
}

# The replicator's own task role: read the source's bucket, nothing else.
resource "aws_iam_role" "replicator" {
  count              = local.replicating ? 1 : 0
  name               = "${var.name}-tabletstore-replicator"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "replicator" {
  count = local.replicating ? 1 : 0
  statement {
    sid       = "ListSourceBucket"
    actions   = ["s3:ListBucket"]
    resources = [var.replication.source_bucket_arn]
  }
  statement {
    sid       = "ReadSourceObjects"
    actions   = ["s3:GetObject"]
    resources = ["${var.replication.source_bucket_arn}/${var.replication.source_prefix}*"]
  }
  statement {
    sid       = "DecryptSourceObjects"
    actions   = ["kms:Decrypt"]
    resources = [var.replication.source_kms_key_arn]
  }
}

resource "aws_iam_role_policy" "replicator" {
  count  = local.replicating ? 1 : 0
  name   = "read-source-bucket"
  role   = aws_iam_role.replicator[0].id
  policy = data.aws_iam_policy_document.replicator[0].json
}

resource "aws_ecs_service" "worker" {
  name                               = "${var.name}-tabletstore-worker"
  cluster                            = aws_ecs_cluster.main.id
  task_definition                    = aws_ecs_task_definition.role["worker"].arn
  desired_count                      = var.workers_min
  launch_type                        = "FARGATE"
  enable_execute_command             = false
  deployment_minimum_healthy_percent = var.replace_all_at_once ? 0 : 100
  deployment_maximum_percent         = var.replace_all_at_once ? 100 : 200
  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [var.worker_security_group_id]
    assign_public_ip = false
  }
  lifecycle {
    ignore_changes = [desired_count] # the autoscaler owns it
  }
  tags = var.tags
}

resource "aws_appautoscaling_target" "workers" {
  service_namespace  = "ecs"
  resource_id        = "service/${aws_ecs_cluster.main.name}/${aws_ecs_service.worker.name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.workers_min
  max_capacity       = var.workers_max
}

# Workers scale on CPU; the master's balancer (§5.2) moves tablets onto new workers.
resource "aws_appautoscaling_policy" "workers_cpu" {
  name               = "${var.name}-tabletstore-workers-cpu"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.workers.service_namespace
  resource_id        = aws_appautoscaling_target.workers.resource_id
  scalable_dimension = aws_appautoscaling_target.workers.scalable_dimension
  target_tracking_scaling_policy_configuration {
    target_value       = var.worker_cpu_target
    scale_in_cooldown  = 300
    scale_out_cooldown = 60
    predefined_metric_specification {
      predefined_metric_type = "ECSServiceAverageCPUUtilization"
    }
  }
}
