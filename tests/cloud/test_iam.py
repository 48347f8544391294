"""The S3 call -> IAM request mapping (tests/cloud/s3_calls.py), the s3:prefix conditions
(tests/cloud/iam.py), and the recorder in front of a real S3 server."""

from __future__ import annotations

import boto3
import pytest

from tests.cloud.iam import listing_allowed
from tests.cloud.s3_calls import Call, IamRequest, S3Recorder, iam_requests, parse

B = "arn:aws:s3:::b"


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        ("HEAD", "/b", b"", [IamRequest("s3:ListBucket", B)]),
        ("GET", "/b?list-type=2&prefix=dev%2Flogs%2F", b"", [IamRequest("s3:ListBucket", B, "dev/logs/")]),
        ("GET", "/b?list-type=2", b"", [IamRequest("s3:ListBucket", B, "")]),
        ("GET", "/b/dev/t/x.parquet", b"", [IamRequest("s3:GetObject", f"{B}/dev/t/x.parquet")]),
        ("HEAD", "/b/dev/a%20b", b"", [IamRequest("s3:GetObject", f"{B}/dev/a b")]),
        ("PUT", "/b/dev/logs/1", b"x", [IamRequest("s3:PutObject", f"{B}/dev/logs/1")]),
        ("DELETE", "/b/dev/logs/1", b"", [IamRequest("s3:DeleteObject", f"{B}/dev/logs/1")]),
        (
            "POST",
            "/b?delete",
            b"<Delete><Object><Key>dev/a</Key></Object><Object><Key>dev/b</Key></Object></Delete>",
            [IamRequest("s3:DeleteObject", f"{B}/dev/a"), IamRequest("s3:DeleteObject", f"{B}/dev/b")],
        ),
    ],
)  # fmt: skip
def test_s3_calls_map_to_what_iam_authorizes(
    method: str, path: str, body: bytes, expected: list[IamRequest]
) -> None:
    assert iam_requests(parse(method, path, body)) == expected


def test_an_unknown_call_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="no IAM mapping"):
        iam_requests(Call("PATCH", "b", None, ()))


POLICY = {
    "Statement": [
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": B,
            "Condition": {"StringLike": {"s3:prefix": ["dev/logs/*", "dev/recovery/*"]}},
        }
    ]
}


def test_prefix_conditions_are_evaluated_as_aws_does() -> None:
    assert listing_allowed([POLICY], IamRequest("s3:ListBucket", B, "dev/logs/w-1/"))
    assert not listing_allowed([POLICY], IamRequest("s3:ListBucket", B, "dev/tables/"))
    # HeadBucket carries no s3:prefix: a statement conditioned on it does not apply.
    assert not listing_allowed([POLICY], IamRequest("s3:ListBucket", B))
    open_list = {"Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": B}]}
    assert listing_allowed([POLICY, open_list], IamRequest("s3:ListBucket", B))
    deny = {"Statement": [{"Effect": "Deny", "Action": "s3:*", "Resource": B}]}
    assert not listing_allowed([open_list, deny], IamRequest("s3:ListBucket", B, "dev/"))


def test_the_recorder_passes_calls_through_and_records_them(seaweedfs_server: str) -> None:
    recorder = S3Recorder(seaweedfs_server)
    try:
        s3 = boto3.client(
            "s3",
            endpoint_url=recorder.endpoint,
            region_name="us-east-1",
            aws_access_key_id="k",
            aws_secret_access_key="s",
        )
        s3.create_bucket(Bucket="recorded")
        s3.put_object(Bucket="recorded", Key="dev/a", Body=b"hello")
        assert (
            s3.get_object(Bucket="recorded", Key="dev/a", Range="bytes=1-3")["Body"].read()
            == b"ell"
        )
        assert [
            o["Key"] for o in s3.list_objects_v2(Bucket="recorded", Prefix="dev/")["Contents"]
        ] == ["dev/a"]
        s3.head_bucket(Bucket="recorded")
    finally:
        recorder.close()
    requests = [r for call in recorder.calls for r in iam_requests(call)]
    arn = "arn:aws:s3:::recorded"
    assert requests == [
        IamRequest("s3:CreateBucket", arn),
        IamRequest("s3:PutObject", f"{arn}/dev/a"),
        IamRequest("s3:GetObject", f"{arn}/dev/a"),
        IamRequest("s3:ListBucket", arn, "dev/"),
        IamRequest("s3:ListBucket", arn),
    ]
