output "endpoints" {
  description = "host:port of each member's client URL (TLS)."
  value       = local.client_urls
}

output "etcd_url" {
  description = "The members as https URLs, for etcdctl."
  value       = join(",", [for e in local.client_urls : "https://${e}"])
}

output "client_url" {
  description = "The cluster's etcd:// URL as tabletstore processes open it: the members, the namespace and the client certificate's files under client_tls_dir."
  value       = local.client_url
}

output "client_tls_dir" {
  description = "Where a process must find ca.pem, client.pem and client.key before it opens client_url."
  value       = var.client_tls_dir
}

output "members" {
  description = "Each member's address, auto-scaling group and snapshot location."
  value = { for name, i in local.members : name => {
    address            = local.addresses[i]
    autoscaling_group  = aws_autoscaling_group.member[name].name
    snapshot_s3_prefix = "s3://${var.bucket}/${local.snapshot_prefix[name]}"
  } }
}

output "member_names" {
  value = keys(local.members)
}

output "quota_bytes" {
  value = var.quota_bytes
}
