"""Every size limit of tabletstore, stated once (§2 data model, §5 implementation;
docs/architecture/design.md §9).

The paper leaves sizes open (§2: row keys are "arbitrary strings (currently up to 64KB in size,
although 10-100 bytes is a typical size for most of our users)"); these are ours. They form one
chain, so nothing a layer accepts is refused by the layer below it::

    row key, qualifier  <=  64 KiB
    value               <=  MAX_VALUE (64 MiB), also after an append
    row mutation        <=  MAX_MUTATION_BYTES = MAX_VALUE + 16 MiB (as
                            ``data.validation.mutation_bytes`` counts it)
    request (= frame)   <=  MAX_REQUEST_BYTES = MAX_MUTATION_BYTES + 1 MiB of envelope
    front-door message  <=  MAX_REQUEST_BYTES (gRPC receive and send limit)

A whole row is not limited: it grows with every write, so reads stream it in pieces of about
``STREAM_ITEM_BYTES`` (``rpc.row_pieces``). A batch (``mutate_rows``) is cut by the client into
requests of about ``BATCH_REQUEST_BYTES`` each (one larger row mutation travels alone), so a
batch of any size fits the frames.

A size over a limit is ``InvalidArgument`` naming the limit and the size: on the client before
anything is sent (``data.validation``, ``rpc.frames.check_outgoing``) and again on the server,
which never trusts its clients (``rpc.frames.FrameParser``, the tablet calling
``data.validation.validate_row_mutation`` again, ``engine.cells.to_cells``, the
front door's gRPC limits). docs/architecture/wire.md has the table.

Resource caps of the servers (connections, buffered bytes, timeouts) are settings, not limits
of the data: :class:`tabletstore.options.RpcServerOptions`.
"""

from __future__ import annotations

__all__ = [
    "BATCH_REQUEST_BYTES",
    "MAX_FRAME",
    "MAX_MUTATION_BYTES",
    "MAX_QUALIFIER",
    "MAX_REQUEST_BYTES",
    "MAX_ROW_KEY",
    "MAX_VALUE",
    "REQUEST_ENVELOPE",
    "STREAM_ITEM_BYTES",
    "UNARY_ROW_BYTES",
    "KiB",
    "MiB",
    "format_size",
]

KiB = 1024
MiB = 1024 * KiB

#: Row keys are arbitrary strings up to 64 KiB (§2).
MAX_ROW_KEY = 64 * KiB
#: Column qualifiers up to 64 KiB (Cloud Bigtable allows 16 KiB): a cell's key parts always fit
#: in one streamed piece of a row, whatever the size of its value.
MAX_QUALIFIER = 64 * KiB
#: Largest value of one cell (Cloud Bigtable's limit is 100 MiB; we keep 64 MiB).
MAX_VALUE = 64 * MiB
#: Largest row mutation, measured by ``data.validation.mutation_bytes`` (its row key, plus each
#: mutation's family, qualifier and value and 32 bytes): one maximal value with room to spare.
MAX_MUTATION_BYTES = MAX_VALUE + 16 * MiB
#: Room for a request's envelope around its row mutation: method name, table and tablet ids,
#: identity, the msgpack headers of the request and of each entry.
REQUEST_ENVELOPE = 1 * MiB
#: The largest request: one maximal row mutation in its envelope (81 MiB). The RPC frame limit
#: and the front door's gRPC message limit are this number.
MAX_REQUEST_BYTES = MAX_MUTATION_BYTES + REQUEST_ENVELOPE
#: The largest RPC frame either side accepts unless configured otherwise (``rpc.frames``).
MAX_FRAME = MAX_REQUEST_BYTES
#: Row-mutation bytes per ``mutate_rows`` request the client sends: a batch is cut into
#: requests of about this size (a larger row mutation alone).
BATCH_REQUEST_BYTES = 16 * MiB
#: Bytes of one item of a ``read_rows`` stream (a batch of rows or a piece of a large row).
STREAM_ITEM_BYTES = 1 * MiB
#: A row larger than this is not sent in one unary ``read_row`` answer: the client reads it
#: through the ``read_rows`` stream instead (``rpc.row_pieces``).
UNARY_ROW_BYTES = 4 * STREAM_ITEM_BYTES

assert MAX_VALUE < MAX_MUTATION_BYTES < MAX_REQUEST_BYTES == MAX_FRAME
assert BATCH_REQUEST_BYTES <= MAX_MUTATION_BYTES


def format_size(n: int) -> str:
    """``16777216`` → ``'16 MiB'``: sizes in error messages, exact when they are whole MiB."""
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB"
    if n >= KiB and n % KiB == 0:
        return f"{n // KiB} KiB"
    return f"{n} bytes"
