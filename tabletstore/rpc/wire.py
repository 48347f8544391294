"""The wire protocol's type table: every value that crosses a connection, with its fixed id.

The ids are part of the protocol (``versions.PROTOCOL_VERSION``): a process must register the
same class under the same id as its peers, so the table is written out here once, by hand,
never derived from import order. Adding a type takes a new id; changing or reusing one needs
a protocol version bump. :func:`register_all` is idempotent and is called by every process
that opens a TCP connection (worker, master, cluster client).
"""

from __future__ import annotations

from tabletstore.data import filters, model, query
from tabletstore.rpc import messages as m
from tabletstore.rpc.codec import DEFAULT_CODEC, Codec, DecodeBudget, WireForm
from tabletstore.rpc.row_pieces import ROW_BATCH_FORM

__all__ = ["FILTER_BUDGET", "RESTORE_TABLE_FORM", "WIRE_FORMS", "WIRE_TYPES", "register_all"]

WIRE_TYPES: dict[int, type] = {
    # model (1-19)
    1: model.SetCell,
    2: model.DeleteCells,
    3: model.DeleteFamily,
    4: model.DeleteRow,
    5: model.RowMutation,
    6: model.Cell,
    7: model.Row,
    8: model.AppendValue,
    9: model.IncrementValue,
    10: model.AddToCell,
    11: model.MergeToCell,
    # 12-19: messages that joined after the model's ids were laid out
    12: m.AdoptCompactionRequest,
    13: m.CopiedBackup,
    # query (20-24)
    20: query.RowRange,
    # filters (25-59)
    25: filters.PassAll,
    26: filters.BlockAll,
    27: filters.Sink,
    28: filters.StripValue,
    29: filters.ApplyLabel,
    30: filters.Chain,
    31: filters.Interleave,
    32: filters.Condition,
    33: filters.RowKeyRegex,
    34: filters.RowSample,
    35: filters.FamilyNameRegex,
    36: filters.ColumnQualifierRegex,
    37: filters.ValueRegex,
    38: filters.ColumnRange,
    39: filters.TimestampRange,
    40: filters.ValueRange,
    41: filters.CellsPerRowOffset,
    42: filters.CellsPerRowLimit,
    43: filters.CellsPerColumnLimit,
    # reads (44-49)
    44: m.RowBatch,  # column-wise (ROW_BATCH_FORM); id 64 carried it as row objects
    # coalesced point reads of several tablets (50-52)
    50: m.TabletKeys,
    51: m.PointReadsRequest,
    52: m.PointReadsResponse,
    # coalesced single-row writes of several tablets (53-57)
    53: m.TabletMutations,
    54: m.MutateTabletsRequest,
    # worker messages (60-89)
    60: m.MutateRowsRequest,
    61: m.EntryError,
    62: m.MutateRowsResponse,
    63: m.ReadRowsRequest,
    65: m.CheckAndMutateRequest,
    66: m.CheckAndMutateResponse,
    67: m.ReadModifyWriteRequest,
    68: m.SampleRowKeysRequest,
    69: m.SampleRowKeysResponse,
    70: m.LoadTabletRequest,
    71: m.UnloadTabletRequest,
    72: m.CompactTabletRequest,
    73: m.UpdateSchemaRequest,
    74: m.ServerStatusRequest,
    75: m.TabletStatus,
    76: m.ServerStatusResponse,
    77: m.RowPiece,
    78: m.LargeRow,
    79: m.ScanProgress,
    80: m.LoadTabletAtRequest,
    # master messages (90-109)
    90: m.TableInfoMessage,
    91: m.CreateTableRequest,
    92: m.TableNameRequest,
    93: m.ListTablesRequest,
    94: m.ListTablesResponse,
    95: m.ModifyFamiliesRequest,
    96: m.CompactTableRequest,
    97: m.SetAdminsRequest,
    # backups, restores and clones (98-105)
    98: m.CreateBackupRequest,
    99: m.BackupInfoMessage,
    100: m.ListBackupsRequest,
    101: m.ListBackupsResponse,
    102: m.BackupIdRequest,
    103: m.UpdateBackupRequest,
    104: m.RestoreTableRequest,
    105: m.CloneTableRequest,
    # history windows (106-108)
    106: m.SetHistoryRequest,
    107: m.HistoryDefaultRequest,
    108: m.HistoryDefaultMessage,
    109: m.SetChangesRequest,
    # snapshots and bulk load (110-122)
    110: m.SnapshotHoldRequest,
    111: m.SnapshotWriteRequest,
    112: m.SnapshotTablet,
    113: m.SnapshotWriteResponse,
    114: m.BulkLoadTabletRequest,
    115: m.BulkLoadTabletResponse,
    116: m.CreateSnapshotRequest,
    117: m.SnapshotInfoMessage,
    118: m.ListSnapshotsRequest,
    119: m.ListSnapshotsResponse,
    120: m.DeleteSnapshotRequest,
    121: m.BulkLoadRequest,
    122: m.BulkLoadResponse,
    # replication (123-127)
    123: m.SetReplicaRequest,
}


def _restore_fields(req: m.RestoreTableRequest) -> tuple[object, ...]:
    if req.copied is None:
        return (req.backup_id, req.new_table)
    return (req.backup_id, req.new_table, req.copied)


def _restore_build(values: tuple[object, ...]) -> m.RestoreTableRequest:
    if len(values) not in (2, 3):
        raise ValueError(f"expected 2 or 3 fields, got {len(values)}")
    backup_id, new_table, copied = (*values, None)[:3]
    if not isinstance(backup_id, str) or not isinstance(new_table, str):
        raise TypeError("backup_id and new_table must be str")
    if copied is not None and not isinstance(copied, m.CopiedBackup):
        raise TypeError(f"field 'copied' must be CopiedBackup | None, got {type(copied).__name__}")
    return m.RestoreTableRequest(backup_id, new_table, copied)


#: RestoreTableRequest with its ``copied`` field optional: absent, the two fields every build
#: has sent and read since the request was added (so an older client's request decodes here,
#: and one without it decodes on an older master); present, a third. Only ``restore_copied``,
#: which an older master refuses before reading the request, carries it.
RESTORE_TABLE_FORM = WireForm(_restore_fields, _restore_build)


#: Types with their own wire form (``codec.WireForm``) instead of their fields.
WIRE_FORMS: dict[type, WireForm] = {
    m.RowBatch: ROW_BATCH_FORM,
    m.RestoreTableRequest: RESTORE_TABLE_FORM,
}


#: Each message's filter parts are counted as they are decoded, against the filter limits
#: (``data.filters.PartsBudget``): a message carries at most one filter, and one of thousands
#: of parts is refused at the first part over a limit, before the rest are built.
FILTER_BUDGET = DecodeBudget(
    filters.PartsBudget,
    {
        cls: filters.charge_part(cls)
        for cls in WIRE_TYPES.values()
        if issubclass(cls, filters.RowFilter)
    },
)


def register_all(codec: Codec = DEFAULT_CODEC) -> Codec:
    """Register every wire type with ``codec`` (idempotent) and charge the filters it decodes
    to :data:`FILTER_BUDGET`. Returns the codec."""
    for type_id, cls in WIRE_TYPES.items():
        codec.register(type_id, cls, WIRE_FORMS.get(cls))
    codec.set_budget(FILTER_BUDGET)
    return codec
