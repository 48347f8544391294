"""The signature-checking S3 server of ``local-stack up --tls`` accepts, through tabletstore's
own S3 client, keys with any character a layout component may hold.

Before, moto checked a signature over the path werkzeug had decoded and turned back into an
IRI, while botocore signs the path percent-encoded: every key with ``!`` (METADATA's table id
``!metadata``, so every METADATA SSTable), ``$&'()*+,:;=@`` or a non-ASCII letter got
SignatureDoesNotMatch, and listing a prefix with one did too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tabletstore.cli import localstack
from tabletstore.cli.local_s3 import read_credentials
from tabletstore.errors import PermissionDenied
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.s3 import S3ObjectStore

pytestmark = pytest.mark.timeout(120)

#: Table ids with each character botocore percent-encodes and werkzeug's IRI decodes.
_TABLE_IDS = (METADATA_TABLE_ID, "t$&'()*+,:;=@", "t é~x", "t%21")


def test_signed_keys_with_reserved_characters_round_trip(tmp_path: Path) -> None:
    credentials = tmp_path / "s3-credentials"
    record = localstack.start_moto(tmp_path / "s3.log", credentials=credentials)
    try:
        key, secret = read_credentials(credentials)
        url = f"s3://{localstack.BUCKET}?endpoint_url={record.url}"
        asyncio.run(_round_trip(url, key, secret))
    finally:
        localstack.stop(record)


async def _round_trip(url: str, key: str, secret: str) -> None:
    store = S3ObjectStore(url, access_key_id=key, secret_access_key=secret)
    try:
        await store.check()
        for table_id in _TABLE_IDS:
            name = layout.sstable_key(table_id, "t00001", "default", "s00001")
            await store.create(name, table_id.encode())
            assert await store.get(name) == table_id.encode()
            info = await store.head(name)
            assert info is not None and info.size == len(table_id.encode())
            listed = [o.key async for o in store.list(f"{layout.TABLES}{table_id}/")]
            assert listed == [name], (table_id, listed)
            await store.delete(name)
            assert await store.get(name) is None
        # The signature is still checked: a wrong secret is refused on the same keys.
        wrong = S3ObjectStore(url, access_key_id=key, secret_access_key="not-the-secret")
        try:
            with pytest.raises(PermissionDenied):
                await wrong.get(layout.sstable_key(METADATA_TABLE_ID, "t1", "default", "s1"))
        finally:
            await wrong.close()
    finally:
        await store.close()
