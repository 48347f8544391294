"""The cloud deployment rehearsed on this machine (scripts/cloud-rehearsal.sh).

* ``plan``: the Terraform plan of ``environments/dev`` against moto, and what the rehearsal
  reads from it (ECS task definitions, Lambda functions, IAM policies);
* ``containers``: an ECS container definition or a Lambda function of the plan as
  ``docker run`` arguments, with only the endpoints replaced by loopback ones;
* ``lambda_runtime``: a local stand-in for the Lambda Runtime API (what ``awslambdaric``
  polls) and the Invoke API in front of it (what boto3's ``lambda.invoke`` calls);
* ``rehearsal``: the run itself (``python -m tests.cloud.rehearsal``).
"""
