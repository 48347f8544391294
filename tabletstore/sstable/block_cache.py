"""The two read caches of a tablet server (§6 "Caching for read performance").

"To improve read performance, tablet servers use two levels of caching. The Scan Cache is a
higher-level cache that caches the key-value pairs returned by the SSTable interface to the
tablet server code. The Block Cache is a lower-level cache that caches SSTables blocks that
were read from GFS" (§6).

* :class:`BlockCache` holds decoded SSTable blocks (``block.Block``), keyed by (object key,
  block index), and decoded pages of format-2 SSTables (``pages.Page``, what a point read
  fetches), keyed by (object key, -1 - page index), bounded by bytes, least recently used first out. One per process, shared by
  every SSTable. Objects are immutable, so an entry never goes stale; :meth:`BlockCache.evict`
  drops an SSTable's blocks once it is no longer read (after a compaction replaced it).
  It also shares the open SSTables' indexes (``reader.SSTableCore``: the parsed footer, the
  block and page indexes, the bloom filters), one per object while any SSTable open on it
  lives, as leveldb's TableCache does: a split's two children open their parent's SSTables
  without a second tail GET or a second copy of the indexes (4-5 % of the data they cover).
* :class:`ScanCache` holds the cells recently returned for a row, keyed by (namespace, row),
  bounded by rows and bytes. What a namespace is and when an entry goes stale is the owner's
  business (the tablet layer): it must call :meth:`ScanCache.invalidate` for a row it writes
  and for a whole namespace when the data behind it changes.

Both count hits, misses and evictions (:class:`CacheStats`). Neither locks: they are used from
one event loop, with no await between a lookup and its update.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tabletstore.errors import InvalidArgument
from tabletstore.keys import Cell
from tabletstore.sstable.block import Block
from tabletstore.sstable.pages import Page

if TYPE_CHECKING:
    from tabletstore.sstable.reader import SSTableCore

__all__ = ["BlockCache", "CacheStats", "ScanCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: A block cache entry's index: a block (>= 0), or ``-1 - page`` for a page (an int, not a
#: tuple: no object made and hashed on every point read's lookups).
_Index = int

#: ``Cell`` from a plain tuple of its fields, without NamedTuple's ``__new__`` arguments.
_new_tuple = tuple.__new__
#: Fields of a ``Cell``.
_FIELDS = len(Cell._fields)

#: Bytes charged per cached cell on top of its key and value bytes (tuple and int objects).
_CELL_OVERHEAD = 200


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of a cache's counters."""

    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    capacity_bytes: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class _Lru(Generic[K, V]):
    """An LRU map bounded by the sum of its entries' charges and by its entry count."""

    def __init__(self, capacity_bytes: int, max_entries: int | None = None) -> None:
        if capacity_bytes < 0 or (max_entries is not None and max_entries < 0):
            raise InvalidArgument(
                f"cache bounds must be non-negative, got {capacity_bytes} bytes, "
                f"{max_entries} entries"
            )
        self.capacity = capacity_bytes
        self.max_entries = max_entries
        self._map: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: K) -> V | None:
        entry = self._map.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._map.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: K, value: V, charge: int) -> list[K]:
        """Insert (or refresh) ``key``; return the keys evicted to make room. An entry larger
        than the whole capacity is not cached (and evicts nothing)."""
        if charge > self.capacity or self.max_entries == 0:
            return []
        entries = self._map
        previous = entries.pop(key, None)
        used = self.used + charge - (previous[1] if previous is not None else 0)
        entries[key] = (value, charge)
        evicted: list[K] = []
        limit = self.max_entries
        while used > self.capacity or (limit is not None and len(entries) > limit):
            old, (_, old_charge) = entries.popitem(last=False)
            used -= old_charge
            evicted.append(old)
        self.used = used
        self.evictions += len(evicted)
        return evicted

    def pop(self, key: K) -> bool:
        entry = self._map.pop(key, None)
        if entry is None:
            return False
        self.used -= entry[1]
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __len__(self) -> int:
        return len(self._map)

    def stats(self) -> CacheStats:
        return CacheStats(
            self.hits, self.misses, self.evictions, len(self._map), self.used, self.capacity
        )


class _SizedLru(_Lru[K, V]):
    """An :class:`_Lru` of values that carry their charge (``nbytes``) and are held as they
    are: no ``(value, charge)`` tuple per entry, which the cyclic GC would track (it holds a
    tracked object) and traverse at every full collection, one per cached block or page."""

    def get(self, key: K) -> V | None:
        entry = self._map.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._map.move_to_end(key)
        self.hits += 1
        return entry  # type: ignore[return-value]

    def put(self, key: K, value: V, charge: int) -> list[K]:
        if charge > self.capacity or self.max_entries == 0:
            return []
        entries: OrderedDict[K, Any] = self._map
        previous = entries.pop(key, None)
        used = self.used + charge - (previous.nbytes if previous is not None else 0)
        entries[key] = value
        evicted: list[K] = []
        limit = self.max_entries
        while used > self.capacity or (limit is not None and len(entries) > limit):
            old, gone = entries.popitem(last=False)
            used -= gone.nbytes
            evicted.append(old)
        self.used = used
        self.evictions += len(evicted)
        return evicted

    def pop(self, key: K) -> bool:
        entry: Any = self._map.pop(key, None)
        if entry is None:
            return False
        self.used -= entry.nbytes
        return True


class BlockCache:
    """Decoded SSTable blocks, bounded by ``capacity_bytes`` (see the module docstring)."""

    def __init__(self, capacity_bytes: int) -> None:
        self._lru: _Lru[tuple[str, _Index], Block | Page] = _SizedLru(capacity_bytes)
        self._by_object: dict[str, set[_Index]] = {}
        #: Open SSTables' cores by (object URL, seq base), held only by the SSTables using
        #: them: the last one closed or collected, the entry goes.
        self._cores: weakref.WeakValueDictionary[tuple[str, int], SSTableCore] = (
            weakref.WeakValueDictionary()
        )

    def open_core(self, name: str, seq_base: int) -> SSTableCore | None:
        """The core of SSTable object ``name`` (its URL) opened with ``seq_base`` that an
        SSTable in use holds, or None."""
        return self._cores.get((name, seq_base))

    def share_core(self, core: SSTableCore) -> SSTableCore:
        """``core``, or the equal one already shared (two opens raced): the one to use."""
        shared = self._cores.setdefault((core.name, core.seq_base), core)
        return shared if shared.size == core.size else core

    @property
    def open_cores(self) -> int:
        """SSTable cores shared now (one per object and seq base open)."""
        return len(self._cores)

    def get(self, key: str, index: int) -> Block | Page | None:
        """Block ``index`` of SSTable object ``key`` (format 2: all its pages), or None."""
        return self._lru.get((key, index))

    def put(self, key: str, index: int, block: Block | Page) -> None:
        """Cache a block, charged ``block.nbytes``; evicts least recently used blocks."""
        self._put(key, index, block)

    def get_page(self, key: str, page: int) -> Page | None:
        """Decoded page ``page`` of SSTable object ``key``, or None (a miss)."""
        entry = self._lru.get((key, -1 - page))
        return entry if isinstance(entry, Page) else None

    def has_page(self, key: str, page: int) -> bool:
        """Whether page ``page`` of ``key`` is cached (a peek: no hit, miss or LRU update)."""
        return (key, -1 - page) in self._lru

    def has_pages(self, key: str, pages: range) -> bool:
        """Whether every page of ``pages`` of ``key`` is cached (peeks, as :meth:`has_page`)."""
        lru = self._lru
        if len(pages) == 1:  # a point read's usual one: no generator
            return (key, -1 - pages.start) in lru
        return all((key, -1 - p) in lru for p in pages)

    def put_page(self, key: str, index: int, page: Page) -> None:
        """Cache a decoded page, charged ``page.nbytes``."""
        self._put(key, -1 - index, page)

    def _put(self, key: str, index: _Index, entry: Block | Page) -> None:
        lru = self._lru
        for k, i in lru.put((key, index), entry, entry.nbytes):
            self._forget(k, i)
        if entry.nbytes <= lru.capacity:  # cached (an entry put is never its own victim)
            indexes = self._by_object.get(key)
            if indexes is None:
                indexes = self._by_object[key] = set()
            indexes.add(index)

    def evict(self, key: str) -> int:
        """Drop every cached block of SSTable object ``key``; returns how many."""
        indexes = self._by_object.pop(key, set())
        for i in indexes:
            self._lru.pop((key, i))
        return len(indexes)

    def _forget(self, key: str, index: _Index) -> None:
        indexes = self._by_object.get(key)
        if indexes is not None:
            indexes.discard(index)
            if not indexes:
                del self._by_object[key]

    def stats(self) -> CacheStats:
        return self._lru.stats()

    def __len__(self) -> int:
        return len(self._lru)


def _cells_charge(row: bytes, cells: Sequence[Cell]) -> int:
    # A loop, not sum() over a generator: most rows read have one cell.
    total = len(row)
    for c in cells:
        total += len(c.row) + len(c.family) + len(c.qualifier) + len(c.value) + _CELL_OVERHEAD
    return total


class ScanCache:
    """Recently returned cells per row, bounded by rows and bytes (see the module docstring).

    An entry holds its cells' fields in one flat tuple (7 per cell), not the ``Cell``s read:
    a namedtuple is never untracked by the garbage collector, a tuple of bytes, str and ints
    is (at its first collection; a tuple of tuples may take more than one). Cached ``Cell``s
    would keep tens of thousands of objects tracked, for every full collection to walk."""

    def __init__(self, max_rows: int, capacity_bytes: int = 64 * 1024 * 1024) -> None:
        self._lru: _Lru[tuple[str, bytes], tuple[Any, ...]] = _Lru(capacity_bytes, max_rows)
        self._by_namespace: dict[str, set[bytes]] = {}

    def get(self, namespace: str, row: bytes) -> list[Cell] | None:
        """The cells cached for ``row`` (possibly empty: a cached absent row), or None."""
        hit = self._lru.get((namespace, row))
        if hit is None:
            return None
        if len(hit) == _FIELDS:  # most rows: one cell
            return [_new_tuple(Cell, hit)]
        return [_new_tuple(Cell, hit[i : i + _FIELDS]) for i in range(0, len(hit), _FIELDS)]

    def put(self, namespace: str, row: bytes, cells: Sequence[Cell]) -> None:
        """Cache what a read of ``row`` returned (an empty sequence caches its absence)."""
        value = tuple(cells[0]) if len(cells) == 1 else tuple(chain.from_iterable(cells))
        key = (namespace, row)
        lru = self._lru
        for ns, r in lru.put(key, value, _cells_charge(row, cells)):
            self._forget(ns, r)
        if key in lru._map:
            rows = self._by_namespace.get(namespace)
            if rows is None:
                rows = self._by_namespace[namespace] = set()
            rows.add(row)

    def invalidate(self, namespace: str, row: bytes | None = None) -> int:
        """Drop ``row`` of ``namespace``, or every row of it when ``row`` is None. Returns the
        number of entries dropped."""
        if row is None:
            rows = self._by_namespace.pop(namespace, set())
            for r in rows:
                self._lru.pop((namespace, r))
            return len(rows)
        dropped = self._lru.pop((namespace, row))
        if dropped:
            self._forget(namespace, row)
        return int(dropped)

    def _forget(self, namespace: str, row: bytes) -> None:
        rows = self._by_namespace.get(namespace)
        if rows is not None:
            rows.discard(row)
            if not rows:
                del self._by_namespace[namespace]

    def stats(self) -> CacheStats:
        return self._lru.stats()

    def __len__(self) -> int:
        return len(self._lru)
