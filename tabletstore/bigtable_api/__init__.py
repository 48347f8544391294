"""The Cloud Bigtable API front door: official Bigtable clients work against tabletstore (§3).

``tabletstore bigtable-api --port P`` serves ``google.bigtable.v2.Bigtable`` and the table
admin half of ``google.bigtable.admin.v2.BigtableTableAdmin`` over a tabletstore database;
existing Bigtable code reaches it with ``BIGTABLE_EMULATOR_HOST=host:port``.

Modules: ``translate`` (pure message <-> tabletstore conversions and the contracts they fix:
names, millisecond timestamps, ranges, filters, errors), ``chunks`` (the ReadRows chunk
stream), ``admin`` (table admin RPCs) and ``server`` (data RPCs, gRPC wiring, servers); the
command that serves it is :mod:`tabletstore.cli.bigtable_api_cmds`. Needs the ``bigtable-api``
extra (google-cloud-bigtable, grpcio).
"""

from __future__ import annotations

from tabletstore.extras import needs_extra

# Every module here needs grpc and Google's protos: without them, say which extra brings them.
with needs_extra("bigtable-api", what="the Cloud Bigtable API (tabletstore.bigtable_api)"):
    import google.cloud.bigtable_v2  # noqa: F401
    import grpc  # noqa: F401

__all__: list[str] = []
