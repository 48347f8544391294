# A 3-member etcd cluster (the paper's Chubby, §4: master election, the servers directory, the
# root tablet's location, schemas): one auto-scaling group of exactly one instance per member,
# each pinned to its own subnet (zone), with a persistent encrypted EBS volume and a fixed
# network interface (so the member's address and data survive an instance replacement: the
# new instance attaches both at boot and rejoins as the same member).
#
# TLS between members (2380) and for clients (2379), client certificates required: each member
# makes its certificate at boot from the CA in Secrets Manager (var.ca_secret_arn, PEM
# {"cert","key"}; infra/terraform/scripts/etcd-ca.sh makes one). tabletstore's etcd client (aetcd) speaks
# plain gRPC, so its processes reach etcd through `etcd grpc-proxy` on 127.0.0.1 inside their
# task (the container image's `etcd-proxy` role, see the cluster module), which holds the client
# certificate.
#
# etcd runs from the tabletstore image (it ships Debian's etcd-server), on the host network.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

data "aws_subnet" "member" {
  count = 3
  id    = var.subnet_ids[count.index % length(var.subnet_ids)]
}

locals {
  members = { for i in range(3) : "etcd-${i}" => i }
  # Host 10 of each subnet is the member's fixed address (AWS reserves hosts 0-3).
  addresses     = [for s in data.aws_subnet.member : cidrhost(s.cidr_block, 10)]
  initial       = join(",", [for name, i in local.members : "${name}=https://${local.addresses[i]}:2380"])
  client_urls   = [for a in local.addresses : "${a}:2379"]
  registry_host = split("/", var.image_uri)[0]
}

resource "aws_network_interface" "member" {
  for_each        = local.members
  subnet_id       = data.aws_subnet.member[each.value].id
  private_ips     = [local.addresses[each.value]]
  security_groups = [var.security_group_id]
  tags            = merge(var.tags, { Name = "${var.name}-${each.key}" })
}

resource "aws_ebs_volume" "data" {
  for_each          = local.members
  availability_zone = data.aws_subnet.member[each.value].availability_zone
  size              = var.volume_gb
  type              = "gp3"
  encrypted         = true
  kms_key_id        = var.kms_key_arn
  tags              = merge(var.tags, { Name = "${var.name}-${each.key}-data" })
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "member" {
  name               = "${var.name}-tabletstore-etcd"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "member" {
  # checkov:skip=CKV_AWS_356:Describe* and ecr:GetAuthorizationToken accept no resource ARN; the attach statement is limited by the resource tag of this cluster.
  statement {
    sid       = "AttachOwnVolumeAndInterface"
    actions   = ["ec2:AttachVolume", "ec2:AttachNetworkInterface"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/tabletstore-etcd"
      values   = [var.name]
    }
  }
  statement {
    sid       = "Describe"
    actions   = ["ec2:DescribeVolumes", "ec2:DescribeNetworkInterfaces"]
    resources = ["*"]
  }
  statement {
    sid       = "ClusterCA"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.ca_secret_arn]
  }
  statement {
    sid       = "PullImage"
    actions   = ["ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    resources = ["*"]
  }
  statement {
    sid       = "Key"
    actions   = ["kms:Decrypt", "kms:CreateGrant"]
    resources = [var.kms_key_arn]
  }
}

resource "aws_iam_role_policy" "member" {
  name   = "etcd-member"
  role   = aws_iam_role.member.id
  policy = data.aws_iam_policy_document.member.json
}

resource "aws_iam_instance_profile" "member" {
  name = "${var.name}-tabletstore-etcd"
  role = aws_iam_role.member.name
}

resource "aws_launch_template" "member" {
  for_each      = local.members
  name          = "${var.name}-tabletstore-${each.key}"
  image_id      = var.ami_id
  instance_type = var.instance_type
  ebs_optimized = true
  iam_instance_profile {
    arn = aws_iam_instance_profile.member.arn
  }
  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required"
  }
  monitoring {
    enabled = true
  }
  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      encrypted   = true
      kms_key_id  = var.kms_key_arn
      volume_size = 20
    }
  }
  network_interfaces {
    subnet_id                   = data.aws_subnet.member[each.value].id
    security_groups             = [var.security_group_id]
    associate_public_ip_address = false
  }
  user_data = base64encode(templatefile("${path.module}/member.sh.tftpl", {
    name          = each.key
    address       = local.addresses[each.value]
    initial       = local.initial
    volume_id     = aws_ebs_volume.data[each.key].id
    eni_id        = aws_network_interface.member[each.key].id
    ca_secret_arn = var.ca_secret_arn
    image_uri     = var.image_uri
    registry_host = local.registry_host
  }))
  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { Name = "${var.name}-${each.key}" })
  }
  tags = var.tags
}

resource "aws_autoscaling_group" "member" {
  for_each            = local.members
  name                = "${var.name}-tabletstore-${each.key}"
  min_size            = 1
  max_size            = 1
  desired_capacity    = 1
  vpc_zone_identifier = [data.aws_subnet.member[each.value].id]
  health_check_type   = "EC2"
  launch_template {
    id      = aws_launch_template.member[each.key].id
    version = aws_launch_template.member[each.key].latest_version
  }
  dynamic "tag" {
    for_each = merge(var.tags, { "tabletstore-etcd" = var.name })
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}
