"""The wire between clients, the master and tablet-server workers (paper §5;
docs/architecture/design.md §8).

- frames.py: the bytes on a connection (handshake, length-prefixed frames, stream credit).
- versions.py: the protocol versions a process speaks (N and N−1) and the one a connection
  uses.
- codec.py: payloads as msgpack, with a registry of message dataclasses; errors by code.
- connection.py: one framed connection (parsing, coalesced writes, flow control).
- rpc_server.py: RpcServer; rpc_client.py: RpcClient (many calls in flight on one connection),
  RpcStream, RpcClientPool, TcpTransport; tcp.py re-exports both and states their contracts.
- messages.py: the request and response types; wire.py: their fixed type ids.
- transport.py: the Transport protocol (what its errors mean) and Method; services.py: one
  typed Protocol per service (TabletService, MasterService), from which the stubs, the
  dispatch tables and the Methods are derived; inprocess.py: the embedded transport.
"""

from __future__ import annotations

from tabletstore.rpc.codec import DEFAULT_CODEC, Codec, register
from tabletstore.rpc.frames import DEFAULT_MAX_FRAME
from tabletstore.rpc.tcp import (
    RpcClient,
    RpcClientPool,
    RpcServer,
    RpcStream,
    TcpTransport,
    parse_address,
)
from tabletstore.rpc.versions import PROTOCOL_VERSION, Versions

__all__ = [
    "DEFAULT_CODEC",
    "DEFAULT_MAX_FRAME",
    "PROTOCOL_VERSION",
    "Codec",
    "RpcClient",
    "RpcClientPool",
    "RpcServer",
    "RpcStream",
    "TcpTransport",
    "Versions",
    "parse_address",
    "register",
]
