output "function_names" {
  description = "Function name by handler kind (log_sort, compaction, gc)."
  value       = { for k, f in aws_lambda_function.function : k => f.function_name }
}

output "function_arns" {
  value = { for k, f in aws_lambda_function.function : k => f.arn }
}

output "executor_environment" {
  description = "The settings workers and the master need to invoke the functions."
  value = {
    TABLETSTORE_EXECUTOR            = "lambda"
    TABLETSTORE_LOG_SORT_FUNCTION   = aws_lambda_function.function["log_sort"].function_name
    TABLETSTORE_COMPACTION_FUNCTION = aws_lambda_function.function["compaction"].function_name
    TABLETSTORE_GC_FUNCTION         = aws_lambda_function.function["gc"].function_name
  }
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
