# A 3-member etcd cluster (the paper's Chubby, §4: master election, the servers directory, the
# root tablet's location, schemas): one auto-scaling group of exactly one instance per member,
# each pinned to its own subnet (zone), with a persistent encrypted EBS volume and a fixed
# network interface (so the member's address and data survive an instance replacement: the
# new instance attaches both at boot and rejoins as the same member). The boot script
# (member.sh.tftpl) reaches EC2 through the network module's ec2 endpoint; the member's role
# may attach only the volume and interface tagged for this cluster, to an instance tagged so.
#
# TLS between members (2380) and for clients (2379), client certificates required: each member
# makes its certificate at boot from the CA in Secrets Manager (var.ca_secret_arn, PEM
# {"cert","key"}; infra/terraform/scripts/etcd-ca.sh makes one). tabletstore's etcd client
# speaks TLS itself, from the files its etcd:// URL names (client_url below: the cluster
# module writes the client certificate there in each task, the functions at their start).
#
# etcd runs from the tabletstore image (it ships Debian's etcd-server and etcdctl), on the host
# network, as the image's user. History is compacted automatically, the database has a quota
# (and an alarm in the alarms module), and every member uploads a snapshot hourly to the
# bucket (etcd-snapshot.sh; restore: docs/operations/cloud-deployment.md).

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
  members = { for i in range(3) : "etcd-${i}" => i }
  # Member i lives in subnet i mod len (three subnets: one zone each).
  subnet_ids   = [for i in range(3) : var.subnet_ids[i % length(var.subnet_ids)]]
  subnet_cidrs = [for i in range(3) : var.subnet_cidrs[i % length(var.subnet_cidrs)]]
  zones        = [for i in range(3) : var.availability_zones[i % length(var.availability_zones)]]
  # Host 10 of each subnet is the member's fixed address (AWS reserves hosts 0-3); two members
  # in one subnet (fewer than three subnets) take hosts 10, 11, 12.
  addresses     = [for i in range(3) : cidrhost(local.subnet_cidrs[i], 10 + floor(i / length(var.subnet_ids)))]
  initial       = join(",", [for name, i in local.members : "${name}=https://${local.addresses[i]}:2380"])
  client_urls   = [for a in local.addresses : "${a}:2379"]
  registry_host = split("/", var.image_uri)[0]
  # ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO[:TAG|@DIGEST] -> the repository's ARN.
  image_parts    = regex("^([0-9]{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com[a-z.]*/([^:@]+)", var.image_uri)
  repository_arn = "arn:${data.aws_partition.current.partition}:ecr:${local.image_parts[1]}:${local.image_parts[0]}:repository/${local.image_parts[2]}"
  # Where every tabletstore process finds the etcd client certificate (the cluster module's
  # init container writes it there in a task, functions/etcd_tls.py in a function: /tmp is
  # writable in both).
  tls_query  = "ca=${var.client_tls_dir}/ca.pem&cert=${var.client_tls_dir}/client.pem&key=${var.client_tls_dir}/client.key"
  client_url = "etcd://${join(",", local.client_urls)}/${var.namespace}?${local.tls_query}"
  # The tag the member role's attach permission requires on the instance, volume and interface.
  cluster_tag     = { "tabletstore-etcd" = var.name }
  snapshot_prefix = { for name, i in local.members : name => "${var.snapshot_prefix}${var.name}/${name}/" }
}

resource "aws_network_interface" "member" {
  for_each        = local.members
  subnet_id       = local.subnet_ids[each.value]
  private_ips     = [local.addresses[each.value]]
  security_groups = [var.security_group_id]
  tags            = merge(var.tags, local.cluster_tag, { Name = "${var.name}-${each.key}" })
}

resource "aws_ebs_volume" "data" {
  for_each          = local.members
  availability_zone = local.zones[each.value]
  size              = var.volume_gb
  type              = "gp3"
  encrypted         = true
  kms_key_id        = var.kms_key_arn
  tags              = merge(var.tags, local.cluster_tag, { Name = "${var.name}-${each.key}-data" })
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
  # checkov:skip=CKV_AWS_111:Same: the attach actions are limited by the cluster tag on the instance, volume and interface.
  # AttachVolume and AttachNetworkInterface are authorized on the instance and on the volume
  # or interface: all three carry the cluster tag (the auto-scaling group propagates it to
  # its instances).
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
    sid       = "RegistryLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }
  statement {
    sid       = "PullImage"
    actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    resources = [local.repository_arn]
  }
  # Attaching a volume encrypted with the key: EC2 creates a grant for the instance.
  statement {
    sid       = "VolumeKey"
    actions   = ["kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncrypt*"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["ec2.${data.aws_region.current.name}.amazonaws.com"]
    }
  }
  # Snapshots: each member uploads under its own prefix (objects encrypted with the bucket key).
  statement {
    sid       = "UploadSnapshots"
    actions   = ["s3:PutObject"]
    resources = [for name, p in local.snapshot_prefix : "${var.bucket_arn}/${p}*"]
  }
  # GenerateDataKey for a PUT; Decrypt too for a multipart upload (the CLI uploads a snapshot
  # above 8 MB in parts).
  statement {
    sid       = "SnapshotKey"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [var.kms_key_arn]
  }
  statement {
    sid       = "DatabaseSizeMetric"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["tabletstore/etcd"]
    }
  }
}

# Session Manager: an operator's shell on a member (restores, member replacement) without an
# inbound port or a key pair.
resource "aws_iam_role_policy_attachment" "ssm" {
  role       = aws_iam_role.member.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

data "aws_partition" "current" {}

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
  # The root volume holds the OS and the image, nothing of etcd's (its data and TLS files are on
  # the data volume): the AWS-managed EBS key encrypts it, which the Auto Scaling
  # service-linked role launching the instance may use without a grant in any key policy.
  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      encrypted   = true
      volume_size = 20
      volume_type = "gp3"
    }
  }
  # The subnet is the auto-scaling group's (vpc_zone_identifier); the interface carries the
  # security group, as a launch template with an interface must.
  network_interfaces {
    device_index                = 0
    security_groups             = [var.security_group_id]
    associate_public_ip_address = false
  }
  user_data = base64encode(templatefile("${path.module}/member.sh.tftpl", {
    name                 = each.key
    deployment           = var.name
    address              = local.addresses[each.value]
    initial              = local.initial
    cluster_token        = "tabletstore-${var.name}"
    volume_id            = aws_ebs_volume.data[each.key].id
    eni_id               = aws_network_interface.member[each.key].id
    ca_secret_arn        = var.ca_secret_arn
    image_uri            = var.image_uri
    registry_host        = local.registry_host
    region               = data.aws_region.current.name
    uid                  = var.image_uid
    quota_bytes          = var.quota_bytes
    compaction_retention = var.compaction_retention
    bucket               = var.bucket
    snapshot_prefix      = local.snapshot_prefix[each.key]
    snapshot_minute      = format("%02d", 15 + 15 * each.value)
    snapshot_script      = base64encode(file("${path.module}/etcd-snapshot.sh"))
  }))
  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, local.cluster_tag, { Name = "${var.name}-${each.key}" })
  }
  tags = var.tags
}

resource "aws_autoscaling_group" "member" {
  for_each            = local.members
  name                = "${var.name}-tabletstore-${each.key}"
  min_size            = 1
  max_size            = 1
  desired_capacity    = 1
  vpc_zone_identifier = [local.subnet_ids[each.value]]
  health_check_type   = "EC2"
  launch_template {
    id      = aws_launch_template.member[each.key].id
    version = aws_launch_template.member[each.key].latest_version
  }
  dynamic "tag" {
    for_each = merge(var.tags, local.cluster_tag)
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}
