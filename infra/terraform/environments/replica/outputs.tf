output "store_url" {
  value = module.storage.store_url
}

output "etcd_url" {
  description = "The etcd members (https), for etcdctl on a member (Session Manager)."
  value       = module.etcd.etcd_url
}

output "cluster_url" {
  description = "The cluster URL every process and client inside the VPC opens (the client certificate in /tmp/etcd-tls)."
  value       = module.cluster.cluster_url
}

output "cli_run_task" {
  description = "Run a tabletstore command from outside the VPC: append the command, e.g. \"command\":[\"ls\"]}]}'"
  value       = module.cluster.cli_run_task
}

output "clients_security_group_id" {
  description = "The group an application inside the VPC joins to reach etcd, the master and the workers."
  value       = module.network.security_group_ids["clients"]
}

output "private_subnet_ids" {
  value = module.network.private_subnet_ids
}

output "functions" {
  value = module.functions.function_names
}

output "etcd_members" {
  value = module.etcd.members
}

output "alarm_topic_arn" {
  value = module.alarms.topic_arn
}

output "log_group" {
  value = module.cluster.log_group
}

output "replicator_role_arn" {
  description = "The replicator's task role: grant it the source bucket's objects in a bucket policy if the source's account is another."
  value       = module.cluster.replicator_role_arn
}
