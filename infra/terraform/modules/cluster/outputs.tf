output "cluster_url" {
  description = "The URL tabletstore processes and clients use (through their etcd grpc-proxy on 127.0.0.1)."
  value       = local.cluster_url
}

output "ecs_cluster_name" {
  value = aws_ecs_cluster.main.name
}

output "task_role_arn" {
  value = aws_iam_role.task.arn
}
