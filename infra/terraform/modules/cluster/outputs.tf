output "cluster_url" {
  description = "The etcd:// URL every process of the cluster opens (inside a task: the client certificate is in the task's /tmp)."
  value       = var.cluster_url
}

output "ecs_cluster_name" {
  value = aws_ecs_cluster.main.name
}

output "task_role_arn" {
  value = aws_iam_role.task.arn
}

output "services" {
  description = "The ECS services by role."
  value       = { master = aws_ecs_service.master.name, worker = aws_ecs_service.worker.name }
}

output "cli_run_task" {
  description = "A tabletstore command from outside the VPC: append the command as JSON, e.g. ...\"command\":[\"ls\"]}]}'; the output is in the cluster's log group."
  value = join(" ", [
    "aws ecs run-task --cluster ${aws_ecs_cluster.main.name}",
    "--task-definition ${aws_ecs_task_definition.role["cli"].family} --launch-type FARGATE",
    "--network-configuration 'awsvpcConfiguration={subnets=[${join(",", var.subnet_ids)}],securityGroups=[${var.clients_security_group_id}],assignPublicIp=DISABLED}'",
    "--overrides '{\"containerOverrides\":[{\"name\":\"cli\",",
  ])
}

output "log_group" {
  value = aws_cloudwatch_log_group.cluster.name
}

output "replicator_role_arn" {
  description = "The replicator's task role (var.replication), null without replication."
  value       = local.replicating ? aws_iam_role.replicator[0].arn : null
}
