"""Cloud Bigtable instances as namespaces inside one tabletstore database (§3, §5).

The paper's Bigtable cluster serves many tables to many applications; Cloud Bigtable groups
tables into *instances* (``projects/P/instances/I``), each its own namespace. The front door
keeps them apart inside one tabletstore database by naming:

* An instance's tables are stored as ``prefix + table_id``, the prefix being ``_``, ten
  lower-case base32 characters of blake2b(``projects/P/instances/I``) and ``.`` -- stable
  (derived from the name alone, so a data call needs no lookup) and short (a Bigtable table id
  has at most 50 characters, so stored names have at most 62; tabletstore allows 64).
  :data:`PREFIX_RE` recognises prefixed names. Fifty bits of hash: instances of one database
  collide with negligible probability.
* The *plain instance* (``--plain-instance ID``, any project; none by default) maps to the
  database's own, unprefixed tables, so tables made with the tabletstore API or CLI can be
  served under one instance id. It lists every table that is neither prefixed nor the
  registry.
* The registry table ``_bigtable_instances`` holds one row per instance (key: the instance's
  name) with its ``Instance`` message and its clusters. CreateInstance writes it; so does the
  first CreateTable in an unregistered instance, since code written for Google's emulator uses
  instances it never created. GetInstance and ListInstances read it; DeleteInstance deletes
  the instance's tables, then its row.

The instance admin RPCs (``google.bigtable.admin.v2.BigtableInstanceAdmin``): CreateInstance
and PartialUpdateInstance are long-running operations in the API; the front door finishes
them before answering, with a done ``Operation``. UpdateInstance, GetInstance, ListInstances,
DeleteInstance, GetCluster and ListClusters are unary. Clusters are recorded as given (there is
no replication: every cluster is the same database) and reported READY.

Tenancy: with bearer tokens on, each call runs acting for its caller (``rpc.auth.ACTING_FOR``)
and an instance belongs to the principal that created it (explicitly or by its first table),
recorded in its registry row. ListInstances shows only the caller's instances; any other call
naming another principal's instance (get, update, delete, clusters, and every table call in it:
admin.py) is PERMISSION_DENIED, as Cloud Bigtable answers a caller without rights on a
resource. The registry itself is read and written as the front door (:func:`own_identity`); the
tables of an instance are protected where they live, by the cluster (admin.py). Without tokens
there is no caller and instances have no owner.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from google.cloud.bigtable_admin_v2.types import bigtable_instance_admin as bia
from google.cloud.bigtable_admin_v2.types import instance as inst
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2

from tabletstore.bigtable_api.translate import TableName, parse_instance_name
from tabletstore.client.client import AsyncClient
from tabletstore.client.table import AsyncTable
from tabletstore.clock import Clock, SystemClock
from tabletstore.data.model import DeleteRow, Row, SetCell
from tabletstore.data.schema import ColumnFamily, MaxVersionsRule
from tabletstore.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from tabletstore.rpc.auth import ACTING_FOR

__all__ = [
    "PREFIX_IN_TEXT",
    "PREFIX_RE",
    "REGISTRY_TABLE",
    "InstanceAdmin",
    "Namespaces",
    "caller",
    "instance_prefix",
    "own_identity",
]

#: The registry of instances (one row per instance, keyed by its name).
REGISTRY_TABLE = "_bigtable_instances"
#: A stored table name that belongs to a prefixed instance.
PREFIX_RE = re.compile(r"^_[a-z2-7]{10}\.")
#: A prefix inside an error message (removed before the message reaches a client).
PREFIX_IN_TEXT = re.compile(r"(?<![A-Za-z0-9_.-])_[a-z2-7]{10}\.(?=[A-Za-z0-9_.-])")
_FAMILY = "i"
_INSTANCE_Q = b"instance"
_OWNER_Q = b"owner"
_CLUSTER_Q = b"cluster:"
_PROJECT_RE = re.compile(r"^projects/([^/]+)$")
_CLUSTER_ID_RE = re.compile(r"^[a-z][-a-z0-9]{5,29}$")
_READY = 1
_PRODUCTION = 1
# proto-plus names the messages' ``type`` field ``type_`` (same field number on the wire).

InstancePB: Any = inst.Instance.pb()
ClusterPB: Any = inst.Cluster.pb()
ListInstancesResponsePB: Any = bia.ListInstancesResponse.pb()
ListClustersResponsePB: Any = bia.ListClustersResponse.pb()
CreateInstanceMetadataPB: Any = bia.CreateInstanceMetadata.pb()
UpdateInstanceMetadataPB: Any = bia.UpdateInstanceMetadata.pb()


def caller() -> str | None:
    """The principal the current call is served for (its bearer token's); None without
    tokens."""
    return ACTING_FOR.get()


@contextlib.contextmanager
def own_identity() -> Iterator[None]:
    """Run a block as the front door itself, not as its caller (the instance registry)."""
    token = ACTING_FOR.set(None)
    try:
        yield
    finally:
        ACTING_FOR.reset(token)


@lru_cache(maxsize=4096)
def instance_prefix(project: str, instance: str) -> str:
    """The stored-name prefix of ``projects/{project}/instances/{instance}``'s tables."""
    digest = hashlib.blake2b(f"projects/{project}/instances/{instance}".encode()).digest()
    return "_" + base64.b32encode(digest).decode("ascii").lower()[:10] + "."


class Namespaces:
    """Maps Bigtable table names to stored tabletstore table names and back."""

    def __init__(self, plain_instance: str | None = None) -> None:
        self.plain_instance = plain_instance

    def prefix(self, project: str, instance: str) -> str:
        return "" if instance == self.plain_instance else instance_prefix(project, instance)

    def table(self, name: TableName) -> str:
        """The stored name of ``name``'s table."""
        if name.instance == self.plain_instance:
            if name.table == REGISTRY_TABLE:
                raise InvalidArgument(f"table id {REGISTRY_TABLE!r} is reserved")
            return name.table
        return instance_prefix(name.project, name.instance) + name.table

    def table_ids(self, project: str, instance: str, stored: Iterable[str]) -> list[str]:
        """The table ids of the instance among the ``stored`` table names."""
        if instance == self.plain_instance:
            return [t for t in stored if t != REGISTRY_TABLE and not PREFIX_RE.match(t)]
        prefix = instance_prefix(project, instance)
        return [t[len(prefix) :] for t in stored if t.startswith(prefix)]


def parse_instance(name: str) -> tuple[str, str]:
    """``projects/P/instances/I`` -> (P, I). Any id is accepted, as on Google's emulator,
    so the instances emulator-era code uses (``-instance i``) work too."""
    return parse_instance_name(name)


def parse_project(name: str) -> str:
    m = _PROJECT_RE.match(name)
    if m is None:
        raise InvalidArgument(f"project name {name!r} is not projects/<project>")
    return m.group(1)


def _operation(name: str, metadata: Any, response: Any) -> Any:
    """A finished long-running operation answering ``response``."""
    op = operations_pb2.Operation(name=name, done=True)
    op.metadata.Pack(metadata)
    op.response.Pack(response)
    return op


class InstanceAdmin:
    """The instance admin RPCs over the registry table; each takes a raw request message."""

    def __init__(
        self, client: AsyncClient, namespaces: Namespaces, *, clock: Clock | None = None
    ) -> None:
        self._client = client
        self._ns = namespaces
        self._clock = clock or SystemClock()
        self._registry_ready = False

    # -- the registry --------------------------------------------------------------------------
    async def _registry(self) -> AsyncTable:
        """The registry table, made on first use (as the front door: call it, and use the
        handle, inside :func:`own_identity`)."""
        if not self._registry_ready:
            try:
                await self._client.create_table(
                    REGISTRY_TABLE,
                    [ColumnFamily(name=_FAMILY, gc_rule=MaxVersionsRule(max_versions=1))],
                )
            except AlreadyExists:
                pass
            self._registry_ready = True
        return self._client.table(REGISTRY_TABLE)

    def _now_micros(self) -> int:
        return int(self._clock.time() * 1000) * 1000

    def _new_instance(self, name: str, given: Any | None) -> Any:
        out = InstancePB()
        if given is not None:
            out.CopyFrom(given)
        out.name = name
        out.display_name = out.display_name or name.rsplit("/", 1)[1]
        out.state = _READY
        out.type_ = out.type_ or _PRODUCTION
        out.create_time.FromMicroseconds(self._now_micros())
        return out

    def _instance_mutations(
        self, instance: Any, clusters: dict[str, Any], owner: str | None = None
    ) -> list[SetCell]:
        now = self._now_micros()
        muts = [SetCell(_FAMILY, _INSTANCE_Q, instance.SerializeToString(), now)]
        if owner is not None:
            muts.append(SetCell(_FAMILY, _OWNER_Q, owner.encode(), now))
        for cid, cluster in sorted(clusters.items()):
            muts.append(
                SetCell(_FAMILY, _CLUSTER_Q + cid.encode(), cluster.SerializeToString(), now)
            )
        return muts

    async def _read(self, name: str) -> Row:
        """The instance's registry row; NotFound if there is none, PermissionDenied if it
        belongs to another principal than the caller."""
        who = caller()
        with own_identity():
            row = await (await self._registry()).read_row(name.encode())
        if row is None or row.latest(_FAMILY, _INSTANCE_Q) is None:
            raise NotFound(f"instance {name!r} does not exist")
        self._check_owner(name, row, who)
        return row

    @staticmethod
    def _check_owner(name: str, row: Row, who: str | None) -> None:
        owner = row.latest(_FAMILY, _OWNER_Q)
        if who is not None and owner is not None and owner.decode() != who:
            raise PermissionDenied(
                f"{who} has no rights on instance {name!r} (it belongs to another principal)"
            )

    async def check_access(self, project: str, instance: str) -> None:
        """PermissionDenied if the caller may not use ``projects/P/instances/I`` (another
        principal's instance); an unregistered or the plain instance is open to all."""
        if instance == self._ns.plain_instance or caller() is None:
            return
        try:
            await self._read(f"projects/{project}/instances/{instance}")
        except NotFound:
            return

    @staticmethod
    def _instance_of(row: Row) -> Any:
        return InstancePB.FromString(row.latest(_FAMILY, _INSTANCE_Q) or b"")

    @staticmethod
    def _clusters_of(row: Row) -> list[Any]:
        return [
            ClusterPB.FromString(c.value)
            for c in row.cells
            if c.family == _FAMILY and c.qualifier.startswith(_CLUSTER_Q)
        ]

    async def _create_row(self, name: str, instance: Any, clusters: dict[str, Any]) -> bool:
        """Write the instance's registry row, owned by the caller, unless it exists (then
        False)."""
        mutations = self._instance_mutations(instance, clusters, caller())
        with own_identity():
            registry = await self._registry()
            existed = await registry.check_and_mutate_row(
                name.encode(), None, false_mutations=mutations
            )
        return not existed

    async def register_implicitly(self, project: str, instance: str) -> None:
        """Record an instance a table is being created in, if it is not recorded yet (code
        written for the emulator never creates its instance)."""
        if instance == self._ns.plain_instance:
            return
        name = f"projects/{project}/instances/{instance}"
        if not await self._create_row(name, self._new_instance(name, None), {}):
            await self._read(name)  # PermissionDenied if another principal's

    # -- RPCs ----------------------------------------------------------------------------------
    async def create_instance(self, req: Any) -> Any:
        parse_project(req.parent)
        name = f"{req.parent}/instances/{req.instance_id}"
        parse_instance(name)
        if req.instance_id == self._ns.plain_instance:
            raise AlreadyExists(f"instance {name!r} already exists (the plain instance)")
        instance = self._new_instance(name, req.instance)
        clusters: dict[str, Any] = {}
        for cid, given in req.clusters.items():
            if not _CLUSTER_ID_RE.match(cid):
                raise InvalidArgument(f"cluster id {cid!r} must be 6-30 characters [a-z0-9-]")
            cluster = ClusterPB()
            cluster.CopyFrom(given)
            cluster.name = f"{name}/clusters/{cid}"
            cluster.state = _READY
            clusters[cid] = cluster
        if not await self._create_row(name, instance, clusters):
            raise AlreadyExists(f"instance {name!r} already exists")
        meta = CreateInstanceMetadataPB(original_request=req)
        meta.request_time.FromMicroseconds(self._now_micros())
        meta.finish_time.FromMicroseconds(self._now_micros())
        return _operation(f"operations/{name}/create", meta, instance)

    async def get_instance(self, req: Any) -> Any:
        _, instance = parse_instance(req.name)
        if instance == self._ns.plain_instance:
            return self._plain(req.name)
        return self._instance_of(await self._read(req.name))

    def _plain(self, name: str) -> Any:
        """The plain instance, in every project: the database's own tables."""
        return InstancePB(
            name=name, display_name=name.rsplit("/", 1)[1], state=_READY, type_=_PRODUCTION
        )

    async def list_instances(self, req: Any) -> Any:
        parse_project(req.parent)
        who = caller()
        out = ListInstancesResponsePB()
        if self._ns.plain_instance is not None:
            out.instances.append(self._plain(f"{req.parent}/instances/{self._ns.plain_instance}"))
        with own_identity():
            registry = await self._registry()
            async for row in registry.read_rows(prefix=f"{req.parent}/instances/".encode()):
                owner = row.latest(_FAMILY, _OWNER_Q)
                if who is None or owner is None or owner.decode() == who:
                    out.instances.append(self._instance_of(row))
        return out

    async def update_instance(self, req: Any) -> Any:
        """UpdateInstance: the request is the Instance; display_name, type, labels change."""
        self._check_not_plain(req.name)
        row = await self._read(req.name)
        current = self._instance_of(row)
        if not req.display_name:
            raise InvalidArgument("UpdateInstance needs a display_name")
        current.display_name = req.display_name
        if req.type_:
            current.type_ = req.type_
        current.labels.clear()
        current.labels.update(req.labels)
        await self._write_instance(current)
        return current

    async def partial_update_instance(self, req: Any) -> Any:
        name = req.instance.name
        self._check_not_plain(name)
        current = self._instance_of(await self._read(name))
        paths = list(req.update_mask.paths)
        if not paths:
            raise InvalidArgument("PartialUpdateInstance needs an update_mask")
        for path in paths:
            if path == "display_name":
                if not req.instance.display_name:
                    raise InvalidArgument("display_name cannot be empty")
                current.display_name = req.instance.display_name
            elif path == "labels":
                current.labels.clear()
                current.labels.update(req.instance.labels)
            elif path == "type":
                current.type_ = req.instance.type_
            else:
                raise InvalidArgument(f"field {path!r} of an instance cannot be updated")
        await self._write_instance(current)
        meta = UpdateInstanceMetadataPB(original_request=req)
        meta.request_time.FromMicroseconds(self._now_micros())
        meta.finish_time.FromMicroseconds(self._now_micros())
        return _operation(f"operations/{name}/update", meta, current)

    def _check_not_plain(self, name: str) -> None:
        if parse_instance(name)[1] == self._ns.plain_instance:
            raise InvalidArgument(f"the plain instance {name!r} cannot be changed")

    async def _write_instance(self, instance: Any) -> None:
        """Rewrite an instance's message (after ``_read`` checked the caller owns it)."""
        with own_identity():
            registry = await self._registry()
            await registry.mutate_row(
                instance.name.encode(), self._instance_mutations(instance, {})
            )

    async def delete_instance(self, req: Any) -> Any:
        project, instance = parse_instance(req.name)
        if instance == self._ns.plain_instance:
            raise InvalidArgument(f"the plain instance {req.name!r} cannot be deleted")
        await self._read(req.name)
        prefix = instance_prefix(project, instance)
        for table in await self._client.list_tables():
            if table.startswith(prefix):
                try:
                    await self._client.delete_table(table)
                except NotFound:
                    pass
        with own_identity():
            registry = await self._registry()
            await registry.mutate_row(req.name.encode(), [DeleteRow()])
        return empty_pb2.Empty()

    async def get_cluster(self, req: Any) -> Any:
        instance_name, _, cid = req.name.rpartition("/clusters/")
        parse_instance(instance_name)
        for cluster in self._clusters_of(await self._read(instance_name)):
            if cluster.name == req.name:
                return cluster
        raise NotFound(f"cluster {cid!r} of instance {instance_name!r} does not exist")

    async def list_clusters(self, req: Any) -> Any:
        parse_instance(req.parent)
        out = ListClustersResponsePB()
        out.clusters.extend(self._clusters_of(await self._read(req.parent)))
        return out
