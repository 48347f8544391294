"""bench/raw_grpc.py against a real grpc.aio server over TLS: a call's message larger than any
flow-control window arrives whole with its length prefix, and a call the server refuses on its
metadata gets the server's grpc-status while the body is still being sent."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from bench.raw_grpc import RawGrpcConnection
from tabletstore.security import ca

pytestmark = pytest.mark.timeout(120)


async def test_raw_calls_are_received_whole_or_refused_on_their_metadata(tmp_path: Path) -> None:
    ca_cert = ca.init_ca(tmp_path / "ca")
    issued = ca.issue(tmp_path / "ca", "server", role="worker", hosts=["127.0.0.1"])
    received: list[bytes] = []

    async def echo_size(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if dict(context.invocation_metadata() or ()).get("authorization") != "Bearer ok":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")
        received.append(request)
        return b""

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 8 << 20)])
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "t.T", {"Call": grpc.unary_unary_rpc_method_handler(echo_size)}
            )
        ]
    )
    credentials = grpc.ssl_server_credentials([(issued.key.read_bytes(), issued.cert.read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    conn = await RawGrpcConnection.open("127.0.0.1", port, ca_cert.read_bytes())
    try:
        body = bytes(range(256)) * (3 << 12)  # 3 MiB: many windows' worth
        ok = await conn.call("/t.T/Call", memoryview(body), (("authorization", "Bearer ok"),))
        assert ok == "0"
        assert received == [body]
        refused = await conn.call("/t.T/Call", memoryview(body * 2))
        assert refused == "16"  # UNAUTHENTICATED
        assert len(received) == 1
    finally:
        await conn.close()
        await server.stop(None)
