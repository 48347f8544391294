output "endpoints" {
  description = "host:port of each member's client URL (TLS)."
  value       = local.client_urls
}

output "etcd_url" {
  description = "The members as https URLs, for etcdctl and the grpc-proxy sidecars."
  value       = join(",", [for e in local.client_urls : "https://${e}"])
}
