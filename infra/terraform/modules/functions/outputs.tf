output "function_names" {
  description = "Function name by handler kind (log_sort, compaction, gc)."
  value       = local.function_names
}

output "function_arns" {
  value = { for k, f in aws_lambda_function.function : k => f.arn }
}

output "invoke_policy_json" {
  description = "A policy that lets the workers' and master's role invoke these functions (and nothing else)."
  value = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid      = "InvokeRecoveryFunctions"
      Effect   = "Allow"
      Action   = ["lambda:InvokeFunction"]
      Resource = [for f in aws_lambda_function.function : f.arn]
    }]
  })
}

output "dead_letter_queue" {
  description = "The dead-letter queue of failed asynchronous invocations (the scheduled GC)."
  value       = aws_sqs_queue.dead_letters.name
}
