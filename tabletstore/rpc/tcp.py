"""The RPC transport over asyncio TCP: RpcServer, RpcClient, RpcClientPool, TcpTransport.

Clients talk to tablet servers and the master talks to workers (paper §5, §5.2) through this
package; docs/architecture/design.md §8 asks for length-prefixed frames with many requests in flight
on one connection. This module is the front door and holds the contracts both ends keep; the parts
are: frames.py (the bytes), codec.py (the payloads), connection.py (one framed connection:
parsing, coalesced writes, flow control), rpc_server.py (RpcServer: dispatch, handler tasks,
shutdown) and rpc_client.py (RpcClient, RpcStream, RpcClientPool, TcpTransport: multiplexing,
timeouts, reconnection). None knows message types: a server is a mapping from method name to
handler (a service's dispatch table, ``services.Service.handlers``), and ``TcpTransport`` carries
the typed ``transport.Method`` of a call by its name, the wire's routing key.

Handlers are ``async def f(request) -> response`` (unary) or ``async def f(request)`` that
``yield``\\ s items (streaming). Each request runs in its own task inside the connection's
TaskGroup; responses are written as they complete, so they may overtake one another. A handler
error from tabletstore.errors reaches the caller as the same class (sent as its
``errors.ErrorCode``); any other exception reaches it as Indeterminate naming the method (the
handler stopped part way; it is logged on the server with its traceback), as does an answer
that cannot be sent.

Contracts:

- Every frame is queued whole (connection.py), so frames written by concurrent tasks never
  interleave; ``drain()`` after a write is the socket-level backpressure.
- Streams are flow-controlled by credit (frames.py): the server sends at most ``window`` items
  the client has not consumed yet, so a producer never runs ahead of a slow consumer by more
  than that, and one slow stream never blocks other requests on the connection.
- A request is cancelled on the server when the client sends CANCEL (a timeout, a cancelled
  caller, a stream closed early) or the connection drops. Handlers must honour cancellation.
- A dropped connection fails every call in flight on it with Indeterminate naming the address
  (sent, no answer); a call on a connection already known dead fails Unreachable (not sent).
  The next call reconnects. A call that times out is Indeterminate if its request was sent,
  Unreachable if not (``rpc/transport.py`` states what each error means).
- ``RpcServer.close(grace=...)`` stops accepting, refuses new requests with Unavailable (not
  run), waits up to ``grace`` seconds for requests in flight, then cancels the rest (their
  callers get Indeterminate) and closes every connection.

uvloop is not chosen here: process entry points may install it; the library works on any loop.
"""

from __future__ import annotations

from tabletstore.rpc.connection import parse_address
from tabletstore.rpc.rpc_client import RpcClient, RpcClientPool, RpcStream, TcpTransport
from tabletstore.rpc.rpc_server import Handler, RpcServer

__all__ = [
    "Handler",
    "RpcClient",
    "RpcClientPool",
    "RpcServer",
    "RpcStream",
    "TcpTransport",
    "parse_address",
]
