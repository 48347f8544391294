output "vpc_id" {
  value = aws_vpc.main.id
}

output "private_subnet_ids" {
  value = aws_subnet.private[*].id
}

output "private_subnet_cidrs" {
  description = "The private subnets' CIDR blocks, in the order of private_subnet_ids (known at plan time)."
  value       = aws_subnet.private[*].cidr_block
}

output "availability_zones" {
  description = "The private subnets' zones, in the order of private_subnet_ids."
  value       = aws_subnet.private[*].availability_zone
}

output "security_group_ids" {
  description = "Security group by role: clients, master, workers, etcd, functions."
  value       = { for role, group in aws_security_group.role : role => group.id }
}

output "ports" {
  value = { worker = var.worker_port, master = var.master_port, metrics = var.metrics_port }
}
