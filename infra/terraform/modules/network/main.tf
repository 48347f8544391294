# The network of one tabletstore deployment: a VPC with private subnets only (nothing in it
# is reachable from the internet), VPC endpoints for the AWS services the processes call, and
# the security groups that encode who may talk to whom:
#
#   clients, master  --(worker port)-->  workers      (the paper's client -> tablet server, §5.1)
#   clients, workers --(master port)-->  master
#   cluster          --(2379, TLS)--->   etcd         (Chubby's replacement, §4)
#   etcd             --(2380, TLS)--->   etcd         (peers)

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

resource "aws_vpc" "main" {
  cidr_block           = var.cidr_block
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = merge(var.tags, { Name = "${var.name}-tabletstore" })
}

# The default security group allows nothing; every resource gets one of the groups below.
resource "aws_default_security_group" "main" {
  vpc_id = aws_vpc.main.id
  tags   = var.tags
}

resource "aws_subnet" "private" {
  count             = length(var.availability_zones)
  vpc_id            = aws_vpc.main.id
  availability_zone = var.availability_zones[count.index]
  cidr_block        = cidrsubnet(var.cidr_block, 4, count.index)
  tags              = merge(var.tags, { Name = "${var.name}-tabletstore-private-${count.index}" })
}

resource "aws_route_table" "private" {
  vpc_id = aws_vpc.main.id
  tags   = var.tags
}

resource "aws_route_table_association" "private" {
  count          = length(aws_subnet.private)
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private.id
}

# Flow logs: every accepted and rejected connection, kept encrypted.
resource "aws_cloudwatch_log_group" "flow" {
  name              = "/tabletstore/${var.name}/vpc-flow"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

data "aws_iam_policy_document" "flow_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "flow" {
  name               = "${var.name}-tabletstore-vpc-flow"
  assume_role_policy = data.aws_iam_policy_document.flow_assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "flow" {
  statement {
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    resources = ["${aws_cloudwatch_log_group.flow.arn}:*"]
  }
}

resource "aws_iam_role_policy" "flow" {
  name   = "flow-logs"
  role   = aws_iam_role.flow.id
  policy = data.aws_iam_policy_document.flow.json
}

resource "aws_flow_log" "main" {
  vpc_id          = aws_vpc.main.id
  traffic_type    = "ALL"
  log_destination = aws_cloudwatch_log_group.flow.arn
  iam_role_arn    = aws_iam_role.flow.arn
  tags            = var.tags
}

# S3 through a gateway endpoint (no NAT: objects never leave the AWS network).
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.main.id
  service_name      = "com.amazonaws.${data.aws_region.current.name}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private.id]
  tags              = var.tags
}

# Image pulls, logs, secrets and function invocations through interface endpoints; ec2 for
# the etcd members' boot script (it attaches the member's interface and volume), monitoring
# for their metrics (etcd's database size against its quota), and ssm, ssmmessages and
# ec2messages for Session Manager (an operator's shell on a member, with no inbound port).
resource "aws_vpc_endpoint" "interface" {
  for_each = toset([
    "ec2",
    "ec2messages",
    "ecr.api",
    "ecr.dkr",
    "lambda",
    "logs",
    "monitoring",
    "secretsmanager",
    "ssm",
    "ssmmessages",
    "sts",
  ])
  vpc_id              = aws_vpc.main.id
  service_name        = "com.amazonaws.${data.aws_region.current.name}.${each.key}"
  vpc_endpoint_type   = "Interface"
  private_dns_enabled = true
  subnet_ids          = aws_subnet.private[*].id
  security_group_ids  = [aws_security_group.endpoints.id]
  tags                = var.tags
}

resource "aws_security_group" "endpoints" {
  name        = "${var.name}-tabletstore-endpoints"
  description = "HTTPS from the VPC to the AWS service endpoints"
  vpc_id      = aws_vpc.main.id
  tags        = var.tags
}

resource "aws_vpc_security_group_ingress_rule" "endpoints_https" {
  security_group_id = aws_security_group.endpoints.id
  description       = "HTTPS from inside the VPC"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = var.cidr_block
}

# One group per role. Egress: to the VPC only (AWS services come through the endpoints).
resource "aws_security_group" "role" {
  # checkov:skip=CKV2_AWS_5:These groups are attached by the cluster, etcd and functions modules (and clients' own resources), outside this module.
  for_each    = toset(["clients", "master", "workers", "etcd", "functions"])
  name        = "${var.name}-tabletstore-${each.key}"
  description = "tabletstore ${each.key}"
  vpc_id      = aws_vpc.main.id
  tags        = var.tags
}

resource "aws_vpc_security_group_egress_rule" "role" {
  for_each          = aws_security_group.role
  security_group_id = each.value.id
  description       = "Anything inside the VPC (peers, etcd, endpoints)"
  ip_protocol       = "-1"
  cidr_ipv4         = var.cidr_block
}

resource "aws_vpc_security_group_egress_rule" "s3" {
  for_each          = aws_security_group.role
  security_group_id = each.value.id
  description       = "S3 through the gateway endpoint"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = aws_vpc_endpoint.s3.prefix_list_id
}

locals {
  # (target group, port, source group, what)
  ingress = {
    worker_from_clients   = ["workers", var.worker_port, "clients", "tablet RPCs from clients"]
    worker_from_master    = ["workers", var.worker_port, "master", "load/unload from the master"]
    worker_from_workers   = ["workers", var.worker_port, "workers", "METADATA reads between workers"]
    worker_from_functions = ["workers", var.worker_port, "functions", "compaction outputs handed to the serving worker"]
    worker_metrics        = ["workers", var.metrics_port, "master", "status and metrics"]
    master_from_clients   = ["master", var.master_port, "clients", "admin RPCs from clients"]
    master_from_workers   = ["master", var.master_port, "workers", "reports from workers"]
    master_from_master    = ["master", var.master_port, "master", "the standby's calls"]
    etcd_from_master      = ["etcd", 2379, "master", "etcd clients (TLS)"]
    etcd_from_workers     = ["etcd", 2379, "workers", "etcd clients (TLS)"]
    etcd_from_clients     = ["etcd", 2379, "clients", "etcd clients (TLS): locations and schemas"]
    etcd_from_functions   = ["etcd", 2379, "functions", "etcd clients (TLS)"]
    etcd_peers            = ["etcd", 2380, "etcd", "etcd peers (TLS)"]
    etcd_clients_of_peers = ["etcd", 2379, "etcd", "etcd members' own health checks"]
  }
}

resource "aws_vpc_security_group_ingress_rule" "role" {
  for_each                     = local.ingress
  security_group_id            = aws_security_group.role[each.value[0]].id
  description                  = each.value[3]
  ip_protocol                  = "tcp"
  from_port                    = each.value[1]
  to_port                      = each.value[1]
  referenced_security_group_id = aws_security_group.role[each.value[2]].id
}
