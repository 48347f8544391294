output "store_url" {
  description = "The object store URL to give tabletstore (tabletstore master --store ...)."
  value       = "s3://${aws_s3_bucket.objects.id}/${trimsuffix(var.prefix, "/")}?region=${aws_s3_bucket.objects.region}"
}

output "bucket" {
  value = aws_s3_bucket.objects.id
}

output "bucket_arn" {
  value = aws_s3_bucket.objects.arn
}

output "prefix" {
  value = var.prefix
}

output "kms_key_arn" {
  description = "The key every object is encrypted with."
  value       = aws_kms_key.objects.arn
}

output "read_write_policy_arn" {
  description = "Attach to the roles of workers and masters."
  value       = aws_iam_policy.read_write.arn
}

output "read_only_policy_arn" {
  description = "Attach to batch jobs that read SSTables straight from the bucket."
  value       = aws_iam_policy.reader.arn
}
