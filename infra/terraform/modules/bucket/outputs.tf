output "store_url" {
  description = "The object store URL to give tabletstore (tabletstore master --store ...)."
  # From the configuration, not the bucket's computed attributes: known at plan time (the
  # master's command carries it, and the plan is what the tests read).
  value      = "s3://${var.bucket_name}/${trimsuffix(var.prefix, "/")}?region=${local.region}"
  depends_on = [aws_s3_bucket.objects]
}

output "bucket" {
  value      = var.bucket_name
  depends_on = [aws_s3_bucket.objects]
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

output "etcd_snapshot_prefix" {
  description = "Where the etcd members upload their snapshots in the bucket (outside the tabletstore prefix)."
  value       = local.etcd_snapshot_prefix
}
