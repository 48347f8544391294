"""The ``tabletstore`` command: the group every verb hangs from and its global options.

Flags and environment variables are read only in :mod:`tabletstore.cli`. Verbs are click
commands registered on :func:`main`, one module per command group (below). The global
``--url`` (env ``TABLETSTORE_URL``) names the database and ``--identity`` (env
``TABLETSTORE_IDENTITY``) the caller checked against column-family ACLs (§2); both are stored
in ``ctx.obj`` (:class:`CliContext`).

The data verbs mirror Google's ``cbt`` (same verbs, ``key=value`` arguments and row output;
the syntax itself lives in :mod:`tabletstore.cli.cbtsyntax`, the CSV form in
:mod:`tabletstore.cli.tablecsv`). The verbs by module: :mod:`~tabletstore.cli.demo`,
:mod:`~tabletstore.cli.schema_cmds` (ls to setgcpolicy), :mod:`~tabletstore.cli.row_cmds`
(set to count), :mod:`~tabletstore.cli.csv_cmds` (import, export),
:mod:`~tabletstore.cli.maintenance_cmds` (flush, compact, gc, verify),
:mod:`~tabletstore.cli.history_cmds` (history, and restore --as-of's body),
:mod:`~tabletstore.cli.change_cmds` (changes, watch),
:mod:`~tabletstore.cli.replication_cmds` (replicate, replication),
:mod:`~tabletstore.cli.batch_cmds` (snapshot, bulkload),
:mod:`~tabletstore.cli.backup_cmds` (backup, restore, clone),
:mod:`~tabletstore.cli.localstack_cmds`, :mod:`~tabletstore.cli.server_cmds` (master,
worker), :mod:`~tabletstore.cli.status_cmds`, :mod:`~tabletstore.cli.security_cmds` (certs,
tokens) and :mod:`~tabletstore.cli.bigtable_api_cmds`. Each invocation opens the database,
does one thing and closes it (closing minor-compacts, so the next open is quick)::

    tabletstore demo                                   the paper's Webtable, written and read
    tabletstore ls [TABLE]                             tables, or a table's families and GC
    tabletstore createtable T [families=f1,f2:maxversions=2] [splits=k1,k2] [--history 24h]
                       [--changes 24h]
    tabletstore deletetable T
    tabletstore createfamily T F[:sum|min|max|hll] | deletefamily T F
    tabletstore setgcpolicy T F maxversions=N | maxage=30d | never | (P or P) and P
    tabletstore set T ROW fam:col=value[@micros] ...
    tabletstore addtocell T ROW fam:col=value[@micros] ...   (aggregate families)
    tabletstore lookup T ROW [columns=..] [cells-per-column=N] [keys-only=true]
    tabletstore read T [start=R] [end=R] [prefix=P] [regex=RE] [count=N] [columns=..]
                       [cells-per-column=N] [keys-only=true]
    tabletstore count T [prefix=P]
    tabletstore deleterow T ROW | deletecolumn T ROW F Q
    tabletstore import T FILE.csv [batch-size=500] [column-family=F]
                       [timestamp=now|value-encoded] [encoding=text|base64]
    tabletstore export T FILE.csv|- [prefix=P] [start=R] [end=R] [encoding=text|base64]
    tabletstore flush T | compact T                    minor / major compaction (§5.4)
    tabletstore gc [--grace S] [--dry-run]             delete unreferenced objects (§5.2)
    tabletstore backup create T [--to LOCATION] [--expire 7d] | list | describe | update |
                       delete | copy                   backups (docs/operations/backups.md)
    tabletstore restore --backup ID NEW_TABLE [--from LOCATION] [--url OTHER_DATABASE]
    tabletstore restore T NEW_TABLE --as-of 2026-11-28T09:15:00Z   T as of an instant
    tabletstore clone T NEW_TABLE [--as-of INSTANT]    a writable zero-copy clone
    tabletstore verify [TABLE | --backup ID] [--deep] [--json]   is it whole? (exit 3 if not)
    tabletstore history T [24h|off] | --default 24h|off   a table's (or the default) window
    tabletstore changes T [24h|off]                    show or set a table's change retention
    tabletstore watch T [--from I] [--until I]         print T's changes as they commit
    tabletstore replicate --source URL T... [--attach] follow T of another cluster (a service)
    tabletstore replication status | promote T         replicas here: lag; failover
    tabletstore [--url URL] local-stack up [--dir DIR] [--s3-url URL | --s3 moto|seaweedfs]
                                           [--workers N] [--persist]
    tabletstore [--url URL] local-stack status [--dir DIR]
    tabletstore [--url URL] local-stack down [--dir DIR]
    tabletstore --url etcd://H:P/NS master [--store URL] [--port P] [--lease-ttl S] [--split-bytes N]
    tabletstore --url etcd://H:P/NS worker [--port P] [--lease-ttl S] [--split-bytes N]
        (master and worker: --metrics-port P serves the status page, /metrics and /status)
    tabletstore status                                 master, workers, tablets, events
    tabletstore certs init DIR | certs issue NAME --dir DIR --role R   a development CA
    tabletstore tokens create NAME | list | revoke NAME                bearer tokens

On a cluster with TLS (docs/operations/security.md), ``--tls-ca``/``--tls-cert``/``--tls-key``
(env ``TABLETSTORE_TLS_CA``/``_CERT``/``_KEY``) and ``--token-file`` (env
``TABLETSTORE_TOKEN_FILE``) or ``TABLETSTORE_TOKEN`` say who the caller is (``--token`` works
too, but a command line is visible to every user of the machine in /proc); a master or worker
serves with them and refuses a non-loopback ``--host`` without them unless ``--insecure``.

On a terminal, import, export, flush and compact show a progress bar on stderr
(:mod:`tabletstore.cli.progress`); otherwise they print only their result.

Failures print one line, ``tabletstore: <what went wrong>``, on stderr and exit 1 (a usage
mistake click detects itself exits 2 with click's usage message); a TabletStoreError never
prints a traceback (:mod:`tabletstore.cli.context`).
"""

from __future__ import annotations

from pathlib import Path

import click

from tabletstore.cli import (
    backup_cmds,
    batch_cmds,
    change_cmds,
    csv_cmds,
    demo,
    history_cmds,
    localstack_cmds,
    maintenance_cmds,
    replication_cmds,
    row_cmds,
    schema_cmds,
    server_cmds,
    status_cmds,
)
from tabletstore.cli.bigtable_api_cmds import bigtable_api  # imports no grpc
from tabletstore.cli.context import CliContext, Failure
from tabletstore.cli.security_cmds import certs_group, tokens_group
from tabletstore.errors import TabletStoreError
from tabletstore.security import TlsConfig

__all__ = ["DEFAULT_URL", "CliContext", "main"]

#: The embedded default: a database in a local directory.
DEFAULT_URL = "file://./tabletstore-data"


@click.group()
@click.option(
    "--url",
    envvar="TABLETSTORE_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Database: file://DIR or a directory path (embedded, the default), memory://NAME.",
)
@click.option(
    "--identity",
    envvar="TABLETSTORE_IDENTITY",
    default=None,
    help="The caller's identity, checked against column-family ACLs.",
)
@click.option("--tls-ca", envvar="TABLETSTORE_TLS_CA", default=None, help="The cluster CA (PEM).")
@click.option(
    "--tls-cert", envvar="TABLETSTORE_TLS_CERT", default=None, help="This process's certificate."
)
@click.option("--tls-key", envvar="TABLETSTORE_TLS_KEY", default=None, help="Its private key.")
@click.option(
    "--token",
    envvar="TABLETSTORE_TOKEN",
    default=None,
    help="A bearer token (tabletstore tokens create) instead of a client certificate. On a "
    "command line it is visible to every user of the machine (/proc): prefer --token-file or "
    "TABLETSTORE_TOKEN.",
)
@click.option(
    "--token-file",
    envvar="TABLETSTORE_TOKEN_FILE",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="A file holding the bearer token (its first line).",
)
@click.pass_context
def main(
    ctx: click.Context,
    url: str,
    identity: str | None,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    token: str | None,
    token_file: Path | None,
) -> None:
    """tabletstore: Bigtable on object storage and etcd.

    Row keys, qualifiers and values on the command line are the argument's bytes (UTF-8
    text, or raw bytes from the shell's $'\\xff' quoting, as in cbt); values print as Go
    quoted strings, as in cbt.
    """
    try:
        tls = TlsConfig.of(tls_ca, tls_cert, tls_key)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    if token_file is not None:
        if token is not None:
            raise Failure("give the token once: --token (or TABLETSTORE_TOKEN) or --token-file")
        lines = token_file.read_text().splitlines()
        token = lines[0].strip() if lines else ""
        if not token:
            raise Failure(f"--token-file {token_file} is empty")
    ctx.obj = CliContext(url=url, identity=identity, tls=tls, token=token)


for _command in (
    demo.demo_cmd,
    schema_cmds.ls_cmd,
    schema_cmds.createtable_cmd,
    schema_cmds.deletetable_cmd,
    schema_cmds.createfamily_cmd,
    schema_cmds.deletefamily_cmd,
    schema_cmds.setgcpolicy_cmd,
    row_cmds.set_cmd,
    row_cmds.addtocell_cmd,
    row_cmds.deleterow_cmd,
    row_cmds.deletecolumn_cmd,
    row_cmds.lookup_cmd,
    row_cmds.read_cmd,
    row_cmds.count_cmd,
    csv_cmds.import_cmd,
    csv_cmds.export_cmd,
    maintenance_cmds.flush_cmd,
    maintenance_cmds.compact_cmd,
    maintenance_cmds.gc_cmd,
    maintenance_cmds.verify_cmd,
    history_cmds.history_cmd,
    change_cmds.changes_cmd,
    change_cmds.watch_cmd,
    replication_cmds.replicate_cmd,
    replication_cmds.replication_group,
    batch_cmds.snapshot_group,
    batch_cmds.bulkload_cmd,
    backup_cmds.backup_group,
    backup_cmds.restore_cmd,
    backup_cmds.clone_cmd,
    localstack_cmds.local_stack,
    server_cmds.master_cmd,
    server_cmds.worker_cmd,
    status_cmds.status_cmd,
    bigtable_api,
    certs_group,
    tokens_group,
):
    main.add_command(_command)

if __name__ == "__main__":
    main()
