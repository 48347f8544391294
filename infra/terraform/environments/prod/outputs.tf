output "store_url" {
  value = module.storage.store_url
}

output "etcd_url" {
  value = module.etcd.etcd_url
}

output "cluster_url" {
  value = module.cluster.cluster_url
}

output "functions" {
  value = module.functions.function_names
}
