"""The plan's IAM policies against the S3 calls each role's processes made.

For each role, an IAM user of moto's server holding exactly the role's policy documents
(inline and attached, from the plan) replays every distinct request the role's processes
made (``tests.cloud.s3_calls``) with moto's IAM enforcement on (``/moto-api/reset-auth``);
then a write and a read outside the role's prefixes, which must be denied. Listings and
HeadBucket go to moto's policy evaluator directly (:func:`check_role` says why).

moto matches actions and resources, but evaluates no ``StringLike`` condition (it treats
one as met), so the ``s3:prefix`` conditions of ``s3:ListBucket`` statements are evaluated
here as AWS does (:func:`listing_allowed`): a statement whose condition names ``s3:prefix``
does not allow a request that carries no prefix (HeadBucket).
"""

from __future__ import annotations

import fnmatch
import json
import re
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from tests.cloud.s3_calls import IamRequest

__all__ = ["check_role", "listing_allowed", "moto_with_users"]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def listing_allowed(documents: Sequence[Mapping[str, Any]], request: IamRequest) -> bool:
    """Whether an ``s3:ListBucket`` request is allowed, conditions on ``s3:prefix`` included
    (StringLike / StringEquals; a Deny that matches wins)."""
    allowed = False
    for document in documents:
        for statement in _list(document.get("Statement", [])):
            actions = _list(statement.get("Action", []))
            resources = _list(statement.get("Resource", []))
            if not any(_matches(a, request.action) for a in actions):
                continue
            if not any(_matches(r, request.resource) for r in resources):
                continue
            if not _conditions_met(statement.get("Condition") or {}, request):
                continue
            if statement.get("Effect") == "Deny":
                return False
            allowed = True
    return allowed


def _conditions_met(conditions: Mapping[str, Mapping[str, Any]], request: IamRequest) -> bool:
    for operator, keys in conditions.items():
        for key, expected in keys.items():
            if key != "s3:prefix":
                raise ValueError(f"condition key {key} is not evaluated here")
            if request.prefix is None:
                return False  # the key is absent from the request: the condition fails
            if operator == "StringLike":
                ok = any(_matches(p, request.prefix) for p in _list(expected))
            elif operator == "StringEquals":
                ok = request.prefix in _list(expected)
            else:
                raise ValueError(f"condition operator {operator} is not evaluated here")
            if not ok:
                return False
    return True


def moto_with_users(
    endpoint: str, bucket: str, roles: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, tuple[str, str]]:
    """On moto's server at ``endpoint``, reset: the bucket (without the bucket policy of the
    plan, which refuses the plain HTTP spoken here), and one user per role holding exactly its
    policy documents; then IAM enforcement on. Returns role -> (access key, secret)."""
    import boto3

    # moto's state is the process's: forget what an earlier server of this process made (the
    # plan's apply made this bucket, with the policy that refuses plain HTTP).
    reset = urllib.request.Request(f"{endpoint}/moto-api/reset", data=b"", method="POST")
    urllib.request.urlopen(reset, timeout=30).close()
    admin = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "admin",
        "aws_secret_access_key": "admin",
    }
    boto3.client("s3", **admin).create_bucket(Bucket=bucket)
    iam = boto3.client("iam", **admin)
    keys = {}
    for role, documents in roles.items():
        user = f"role-{role}"[:64]
        iam.create_user(UserName=user)
        for i, document in enumerate(documents):
            iam.put_user_policy(
                UserName=user, PolicyName=f"p{i}", PolicyDocument=json.dumps(document)
            )
        key = iam.create_access_key(UserName=user)["AccessKey"]
        keys[role] = (key["AccessKeyId"], key["SecretAccessKey"])
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=b"0",  # no request without credentials from here on
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(request, timeout=30).close()
    return keys


def _unreserved(key: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9._~/-]*", key) is not None


def _replay(s3: Any, bucket: str, request: IamRequest) -> bool | None:
    """Whether moto allows ``request`` (made as the S3 call it stands for); None where moto's
    server cannot check the call's signature; any other answer than allowed or denied is an
    error."""
    from botocore.exceptions import ClientError

    key = request.resource.split(":::", 1)[1].partition("/")[2]
    try:
        if request.action == "s3:ListBucket":
            if request.prefix is None:
                s3.head_bucket(Bucket=bucket)
            else:
                s3.list_objects_v2(Bucket=bucket, Prefix=request.prefix)
        elif request.action == "s3:GetObject":
            s3.get_object(Bucket=bucket, Key=key)
        elif request.action == "s3:PutObject":
            s3.put_object(Bucket=bucket, Key=key, Body=b"")
        elif request.action == "s3:DeleteObject":
            s3.delete_object(Bucket=bucket, Key=key)
        elif request.action == "s3:GetBucketLocation":
            s3.get_bucket_location(Bucket=bucket)
        else:
            raise ValueError(f"no replay for {request}")
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if code in ("AccessDenied", "403"):
            return False
        if code in ("NoSuchKey", "404", "NoSuchBucket"):
            return True  # authorized, then not found
        if code == "SignatureDoesNotMatch" and not _unreserved(key):
            # moto's server signs a key with a sub-delimiter ('!' of tables/!metadata/)
            # differently from botocore: its policy evaluator decides, as for listings.
            return None
        raise ValueError(f"moto answered {request} with {code}: {exc}") from exc
    return True


def check_role(
    endpoint: str,
    bucket: str,
    credentials: tuple[str, str],
    documents: Sequence[Mapping[str, Any]],
    requests: Sequence[IamRequest],
    outside: str,
) -> list[str]:
    """Problems of one role: each request it made that is denied, and each request outside
    its prefixes (``outside``: a key) that is allowed; empty when the policy fits."""
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=credentials[0],
        aws_secret_access_key=credentials[1],
    )
    problems = []
    for request in requests:
        if request.action == "s3:ListBucket":
            # moto's server authorizes HeadBucket as "s3:HeadBucket" (AWS: s3:ListBucket) and
            # refuses the signature of a listing whose prefix has a '/': its policy evaluator
            # decides these, with the action and resource AWS uses.
            allowed = _moto_allows(documents, request)
        else:
            replayed = _replay(s3, bucket, request)
            allowed = _moto_allows(documents, request) if replayed is None else replayed
        if allowed and request.action == "s3:ListBucket":
            allowed = listing_allowed(documents, request)
        if not allowed:
            problems.append(f"denied: {request}")
    # Objects outside the role's prefixes (listing is bucket-wide by design: HeadBucket).
    arn = f"arn:aws:s3:::{bucket}/{outside}"
    for probe in (IamRequest("s3:PutObject", arn), IamRequest("s3:GetObject", arn)):
        if _replay(s3, bucket, probe):
            problems.append(f"allowed outside its prefixes: {probe}")
    return problems


def _moto_allows(documents: Sequence[Mapping[str, Any]], request: IamRequest) -> bool:
    """moto's IAM policy evaluation of ``request`` over ``documents`` (an explicit deny wins)."""
    from moto.iam.access_control import IAMPolicy, PermissionResult

    results = [
        IAMPolicy(json.dumps(d)).is_action_permitted(request.action, request.resource)
        for d in documents
    ]
    return PermissionResult.PERMITTED in results and PermissionResult.DENIED not in results
