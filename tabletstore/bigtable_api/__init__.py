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

__all__: list[str] = []
