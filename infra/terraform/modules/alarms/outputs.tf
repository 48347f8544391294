output "topic_arn" {
  description = "The SNS topic every alarm notifies."
  value       = aws_sns_topic.alarms.arn
}

output "alarm_names" {
  value = concat(
    [for a in aws_cloudwatch_metric_alarm.tasks_running : a.alarm_name],
    [aws_cloudwatch_metric_alarm.worker_cpu.alarm_name, aws_cloudwatch_metric_alarm.s3_errors.alarm_name, aws_cloudwatch_metric_alarm.dead_letters.alarm_name],
    [for a in aws_cloudwatch_metric_alarm.function : a.alarm_name],
    [for a in aws_cloudwatch_metric_alarm.etcd_db_size : a.alarm_name],
    [for a in aws_cloudwatch_metric_alarm.etcd_reporting : a.alarm_name],
  )
}
