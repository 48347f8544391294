"""Every coordinator key tabletstore uses: the Chubby namespace of §4 and §5.1 as etcd keys.

Keys are relative to the coordinator's namespace (an etcd URL's path, e.g.
``etcd://127.0.0.1:2379/prod`` stores ``servers/w1`` as ``prod/servers/w1``). Layout::

    elections/<name>/<lease-id:016x>  election candidates; "master" is the master lock (§5.2)
    servers/<worker-id>               the servers directory (§5.2), attached to the worker's lease
    draining/<worker-id>              a worker stopping on purpose (flushing and releasing its
                                      tablets, its RPC listener closed), attached to its lease:
                                      the master's failure detector leaves it alone
    root                              the root tablet's location (§5.1)
    schemas/<table>                   a table's schema (§4)
    acls/<table>                      a table's access-control lists (§4, §5.3)
    claims/<table-id>/<tablet-id>     the worker serving a tablet, attached to its lease; the
                                      claim's create_revision is the tablet's epoch (DESIGN §6)
    assignments/<table-id>/<tablet-id> the master's decision of who should serve a tablet
    settings/<name>                   cluster-wide settings
    tablets/<table-id>/<tablet-id>    a tablet's record (metadata.TabletRecord) while the
                                      catalog keeps records in the coordinator
    status_pages/<role>/<id>          a process's status page URL (role: master or worker; id:
                                      the master's RPC address or the worker id), attached to
                                      the process's lease so a dead process's link goes away
    sorts/<worker-id>/<incarnation>/<first-segment>
                                      a sort task of a dead worker's log published for the
                                      live workers (§6; master.log_recovery), deleted once done
    sorters/<worker-id>/<incarnation>/<first-segment>
                                      the live worker running that task, attached to its lease
                                      (a dead sorter's claim vanishes and another takes it)
    sorts/<worker-id>/<incarnation>/<first-segment>/<restore-id>, and the same under sorters/
                                      a sort task of a point-in-time restore (its plan and
                                      runs under the bucket's restores/<restore-id>/)
    bulk_loads/<table-id>/<load-id>   a bulk load's state (loading, done) as JSON
                                      (master.bulk_load): a done load is not loaded again
    replication/<table>               a replica table's replication progress as JSON (the
                                      tokens of its partitions, how far it has applied:
                                      client/replication_plan.py), or a promoted table's
                                      promotion instant
    tokens/<sha256 of the token>      a bearer token's principal (coordination.tokens); the
                                      token itself is never stored
    .check                            never written: what a coordinator's check() reads to
                                      prove it may reach the namespace

Each name component is a non-empty string without ``/`` (and without NUL); anything else is
an InvalidArgument. Every builder has a parser so that a watch on a prefix can be decoded.
"""

from __future__ import annotations

from tabletstore.errors import InvalidArgument

__all__ = [
    "ACLS",
    "ASSIGNMENTS",
    "BULK_LOADS",
    "CHECK",
    "CLAIMS",
    "DRAINING",
    "ELECTIONS",
    "MASTER_ELECTION",
    "REPLICATION",
    "ROOT_TABLET",
    "SCHEMAS",
    "SERVERS",
    "SETTINGS",
    "SORTERS",
    "SORTS",
    "STATUS_PAGES",
    "TABLETS",
    "TOKENS",
    "acl",
    "assignment",
    "assignments_prefix",
    "bulk_load",
    "bulk_loads_prefix",
    "claim",
    "claims_prefix",
    "draining",
    "election_prefix",
    "parse_acl",
    "parse_assignment",
    "parse_bulk_load",
    "parse_claim",
    "parse_draining",
    "parse_replication",
    "parse_schema",
    "parse_server",
    "parse_setting",
    "parse_sort",
    "parse_sort_task",
    "parse_status_page",
    "replication",
    "schema",
    "server",
    "setting",
    "sort",
    "sorter",
    "status_page",
    "status_pages_prefix",
    "tablet",
    "tablets_prefix",
]

ELECTIONS = "elections/"
SERVERS = "servers/"
DRAINING = "draining/"
ROOT_TABLET = "root"
SCHEMAS = "schemas/"
ACLS = "acls/"
CLAIMS = "claims/"
ASSIGNMENTS = "assignments/"
SETTINGS = "settings/"
TABLETS = "tablets/"
STATUS_PAGES = "status_pages/"
SORTS = "sorts/"
SORTERS = "sorters/"
BULK_LOADS = "bulk_loads/"
TOKENS = "tokens/"
REPLICATION = "replication/"
CHECK = ".check"

#: The election whose leader is the master (the master lock of §5.2).
MASTER_ELECTION = "master"


def _component(value: str, what: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or "\x00" in value:
        raise InvalidArgument(f"{what} must be a non-empty string without '/': {value!r}")
    return value


def _parse(key: str, prefix: str, parts: int, what: str) -> list[str]:
    if not key.startswith(prefix):
        raise InvalidArgument(f"not a {what} key: {key!r}")
    rest = key[len(prefix) :].split("/")
    if len(rest) != parts or not all(rest):
        raise InvalidArgument(f"malformed {what} key: {key!r}")
    return rest


def election_prefix(name: str) -> str:
    return f"{ELECTIONS}{_component(name, 'election name')}/"


def server(worker_id: str) -> str:
    return f"{SERVERS}{_component(worker_id, 'worker id')}"


def parse_server(key: str) -> str:
    return _parse(key, SERVERS, 1, "server")[0]


def draining(worker_id: str) -> str:
    return f"{DRAINING}{_component(worker_id, 'worker id')}"


def parse_draining(key: str) -> str:
    return _parse(key, DRAINING, 1, "draining")[0]


def schema(table: str) -> str:
    return f"{SCHEMAS}{_component(table, 'table name')}"


def parse_schema(key: str) -> str:
    return _parse(key, SCHEMAS, 1, "schema")[0]


def acl(table: str) -> str:
    return f"{ACLS}{_component(table, 'table name')}"


def parse_acl(key: str) -> str:
    return _parse(key, ACLS, 1, "acl")[0]


def claims_prefix(table_id: str | None = None) -> str:
    """All claims, or those of one table."""
    if table_id is None:
        return CLAIMS
    return f"{CLAIMS}{_component(table_id, 'table id')}/"


def claim(table_id: str, tablet_id: str) -> str:
    return f"{claims_prefix(table_id)}{_component(tablet_id, 'tablet id')}"


def parse_claim(key: str) -> tuple[str, str]:
    table_id, tablet_id = _parse(key, CLAIMS, 2, "claim")
    return table_id, tablet_id


def assignments_prefix(table_id: str | None = None) -> str:
    if table_id is None:
        return ASSIGNMENTS
    return f"{ASSIGNMENTS}{_component(table_id, 'table id')}/"


def assignment(table_id: str, tablet_id: str) -> str:
    return f"{assignments_prefix(table_id)}{_component(tablet_id, 'tablet id')}"


def parse_assignment(key: str) -> tuple[str, str]:
    table_id, tablet_id = _parse(key, ASSIGNMENTS, 2, "assignment")
    return table_id, tablet_id


def setting(name: str) -> str:
    return f"{SETTINGS}{_component(name, 'setting name')}"


def parse_setting(key: str) -> str:
    return _parse(key, SETTINGS, 1, "setting")[0]


def tablets_prefix(table_id: str | None = None) -> str:
    """``tablets/`` or ``tablets/<table-id>/``: the tablet records of every / one table."""
    if table_id is None:
        return TABLETS
    return f"{TABLETS}{_component(table_id, 'table id')}/"


def tablet(table_id: str, tablet_id: str) -> str:
    return f"{tablets_prefix(table_id)}{_component(tablet_id, 'tablet id')}"


def status_pages_prefix(role: str | None = None) -> str:
    """``status_pages/`` or ``status_pages/<role>/``: the status page URLs of every process /
    of one role (``master`` or ``worker``)."""
    if role is None:
        return STATUS_PAGES
    return f"{STATUS_PAGES}{_component(role, 'process role')}/"


def status_page(role: str, process_id: str) -> str:
    return f"{status_pages_prefix(role)}{_component(process_id, 'process id')}"


def parse_status_page(key: str) -> tuple[str, str]:
    role, process_id = _parse(key, STATUS_PAGES, 2, "status page")
    return role, process_id


def sort(worker_id: str, incarnation: int, first_segment: int, scope: str | None = None) -> str:
    """A published sort task: segments from ``first_segment`` of one worker incarnation's log
    (``scope``: of a restore's sort, ``SortPlan.scope``)."""
    return f"{SORTS}{_sort_suffix(worker_id, incarnation, first_segment, scope)}"


def sorter(worker_id: str, incarnation: int, first_segment: int, scope: str | None = None) -> str:
    """The claim of the live worker running that sort task (attached to its lease)."""
    return f"{SORTERS}{_sort_suffix(worker_id, incarnation, first_segment, scope)}"


def parse_sort(key: str) -> tuple[str, int, int]:
    """The inverse of :func:`sort`: (worker id, incarnation, first segment)."""
    worker_id, incarnation, first = _parse(key, SORTS, 3, "sort task")
    try:
        return worker_id, int(incarnation), int(first)
    except ValueError as exc:
        raise InvalidArgument(f"{key!r} is not a sort task key") from exc


def parse_sort_task(key: str) -> tuple[str, int, int, str | None]:
    """A published sort task of a recovery or of a restore: (worker id, incarnation, first
    segment, the restore's scope or None)."""
    if not key.startswith(SORTS):
        raise InvalidArgument(f"not a sort task key: {key!r}")
    parts = len(key[len(SORTS) :].split("/"))
    if parts == 3:
        return (*parse_sort(key), None)
    worker_id, incarnation, first, scope = _parse(key, SORTS, 4, "sort task")
    try:
        return worker_id, int(incarnation), int(first), scope
    except ValueError as exc:
        raise InvalidArgument(f"{key!r} is not a sort task key") from exc


def _sort_suffix(
    worker_id: str, incarnation: int, first_segment: int, scope: str | None = None
) -> str:
    if incarnation < 0 or first_segment < 0:
        raise InvalidArgument("incarnation and first segment must be >= 0")
    suffix = f"{_component(worker_id, 'worker id')}/{incarnation}/{first_segment}"
    return suffix if scope is None else f"{suffix}/{_component(scope, 'restore id')}"


def bulk_loads_prefix(table_id: str | None = None) -> str:
    """``bulk_loads/`` or ``bulk_loads/<table-id>/``: the bulk loads of every / one table."""
    if table_id is None:
        return BULK_LOADS
    return f"{BULK_LOADS}{_component(table_id, 'table id')}/"


def bulk_load(table_id: str, load_id: str) -> str:
    return f"{bulk_loads_prefix(table_id)}{_component(load_id, 'bulk load id')}"


def parse_bulk_load(key: str) -> tuple[str, str]:
    table_id, load_id = _parse(key, BULK_LOADS, 2, "bulk load")
    return table_id, load_id


def replication(table: str) -> str:
    return f"{REPLICATION}{_component(table, 'table')}"


def parse_replication(key: str) -> str:
    return _parse(key, REPLICATION, 1, "replication")[0]
