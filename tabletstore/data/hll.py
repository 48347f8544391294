"""HyperLogLog++ sketches: the state of a ``hll`` aggregate column family (§2 data model,
extended with Cloud Bigtable's aggregate families).

A sketch estimates how many distinct byte strings were added to it, in bounded space, and two
sketches merge into the sketch of the union (register-wise maximum), so partial states combine
in any order and any grouping -- what the memtable, reads and compactions need (the combine
may run again over already combined states without changing the result: max is idempotent).

The algorithm is HyperLogLog++ (Heule, Nunkesser, Hall, EDBT 2013) with precision
``p = 14`` (16,384 registers, standard error 1.04 / sqrt(2^14) = 0.81%):

* the hash is 64 bits (BLAKE2b with an 8-byte digest, stable across processes and versions,
  unlike Python's ``hash``), so no large-range correction is needed;
* a *sparse* representation (the sorted list of non-zero registers) keeps small sketches
  small; it turns dense once it would be larger than the dense one;
* the estimate is Ertl's improved estimator ("New cardinality estimation algorithms for
  HyperLogLog sketches", 2017), unbiased over the whole range, in place of HLL++'s empirical
  bias-correction tables and linear-counting threshold.

Serialization (big endian)::

    u8 encoding (1 sparse, 2 dense) | u8 precision
    sparse: u32 count | count x u32 (register index << 6 | register value), index ascending
    dense:  2^p bytes, one register value each

Cloud Bigtable stores Zetasketch's HLL++ protocol buffer; this format is tabletstore's own (a
read returns it as the cell's value; :func:`estimate` reads it back).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable

import numpy as np

__all__ = [
    "PRECISION",
    "Sketch",
    "add_values",
    "estimate",
    "merge_states",
    "parse",
]

#: Register-index bits: 2^14 registers.
PRECISION = 14
_SPARSE = 1
_DENSE = 2
_HEADER = struct.Struct(">BB")
_U32 = struct.Struct(">I")
_ENTRY_BITS = 6  # register values are at most 64 - p + 1 = 51 < 64
_ALPHA_INF = 1.0 / (2.0 * math.log(2.0))


def _hash(value: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "big")


def _register(value: bytes, p: int) -> tuple[int, int]:
    """The register index and value (1 + leading zeros of the remaining bits) of an input."""
    h = _hash(value)
    index = h >> (64 - p)
    rest = h & ((1 << (64 - p)) - 1)
    rho = (64 - p) - rest.bit_length() + 1
    return index, rho


class Sketch:
    """A mutable sketch: sparse (a dict of non-zero registers) until that outgrows dense."""

    __slots__ = ("_dense", "_p", "_sparse")

    def __init__(self, p: int = PRECISION) -> None:
        if not 4 <= p <= 18:
            raise ValueError(f"HyperLogLog precision {p} is outside [4, 18]")
        self._p = p
        self._sparse: dict[int, int] | None = {}
        self._dense: np.ndarray | None = None

    @property
    def precision(self) -> int:
        return self._p

    @property
    def is_sparse(self) -> bool:
        return self._sparse is not None

    def _limit(self) -> int:
        # A sparse entry is 4 bytes, a dense register 1: sparse while it is the smaller.
        return (1 << self._p) // 4

    def _densify(self) -> np.ndarray:
        if self._dense is None:
            dense = np.zeros(1 << self._p, dtype=np.uint8)
            assert self._sparse is not None
            if self._sparse:
                idx = np.fromiter(self._sparse.keys(), dtype=np.int64)
                val = np.fromiter(self._sparse.values(), dtype=np.uint8)
                dense[idx] = val
            self._dense = dense
            self._sparse = None
        return self._dense

    def set_register(self, index: int, rho: int) -> None:
        if self._sparse is not None:
            if rho > self._sparse.get(index, 0):
                self._sparse[index] = rho
                if len(self._sparse) > self._limit():
                    self._densify()
            return
        assert self._dense is not None
        if rho > self._dense[index]:
            self._dense[index] = rho

    def add(self, value: bytes) -> None:
        """Count one input (a byte string; equal strings count once)."""
        index, rho = _register(value, self._p)
        self.set_register(index, rho)

    def merge(self, other: Sketch) -> None:
        """Make this the sketch of the union of both inputs (register-wise maximum)."""
        if other._p != self._p:
            raise ValueError(
                f"cannot merge HyperLogLog sketches of precision {other._p} and {self._p}"
            )
        if other._sparse is not None:
            for index, rho in other._sparse.items():
                self.set_register(index, rho)
            return
        assert other._dense is not None
        dense = self._densify()
        np.maximum(dense, other._dense, out=dense)

    def registers(self) -> np.ndarray:
        """All 2^p register values (a copy when sparse)."""
        if self._dense is not None:
            return self._dense
        out = np.zeros(1 << self._p, dtype=np.uint8)
        assert self._sparse is not None
        for index, rho in self._sparse.items():
            out[index] = rho
        return out

    def estimate(self) -> int:
        """The estimated number of distinct inputs (Ertl's improved raw estimator)."""
        p = self._p
        m = 1 << p
        q = 64 - p
        counts = np.bincount(self.registers(), minlength=q + 2)
        z = m * _tau(1.0 - counts[q + 1] / m)
        for k in range(q, 0, -1):
            z = 0.5 * (z + float(counts[k]))
        z += m * _sigma(counts[0] / m)
        if z == math.inf:
            return 0
        return round(_ALPHA_INF * m * m / z)

    def to_bytes(self) -> bytes:
        if self._sparse is not None:
            entries = sorted(self._sparse.items())
            body = struct.pack(
                f">I{len(entries)}I",
                len(entries),
                *((i << _ENTRY_BITS) | r for i, r in entries),
            )
            return _HEADER.pack(_SPARSE, self._p) + body
        assert self._dense is not None
        return _HEADER.pack(_DENSE, self._p) + self._dense.tobytes()


def _sigma(x: float) -> float:
    if x == 1.0:
        return math.inf
    y = 1.0
    z = x
    while True:
        x *= x
        z_old = z
        z += x * y
        y += y
        if z == z_old:
            return z


def _tau(x: float) -> float:
    if x == 0.0 or x == 1.0:
        return 0.0
    y = 1.0
    z = 1.0 - x
    while True:
        x = math.sqrt(x)
        z_old = z
        y *= 0.5
        z -= (1.0 - x) ** 2 * y
        if z == z_old:
            return z / 3.0


def parse(data: bytes) -> Sketch:
    """A sketch from its serialized bytes; ValueError naming the problem when malformed."""
    if len(data) < _HEADER.size:
        raise ValueError(f"a HyperLogLog state is at least 2 bytes, not {len(data)}")
    encoding, p = _HEADER.unpack_from(data)
    sketch = Sketch(p)
    body = memoryview(data)[_HEADER.size :]
    q = 64 - p
    if encoding == _SPARSE:
        if len(body) < 4:
            raise ValueError("sparse HyperLogLog state has no entry count")
        (count,) = _U32.unpack_from(body)
        if len(body) != 4 + 4 * count:
            raise ValueError(
                f"sparse HyperLogLog state of {count} entries is {len(body)} bytes, "
                f"not {4 + 4 * count}"
            )
        if count > sketch._limit():
            raise ValueError(f"sparse HyperLogLog state has {count} entries, more than dense")
        entries = struct.unpack_from(f">{count}I", body, 4)
        sparse: dict[int, int] = {}
        for e in entries:
            index, rho = e >> _ENTRY_BITS, e & ((1 << _ENTRY_BITS) - 1)
            if index >= (1 << p) or not 1 <= rho <= q + 1:
                raise ValueError(f"sparse HyperLogLog entry {e:#x} is out of range")
            sparse[index] = max(rho, sparse.get(index, 0))
        sketch._sparse = sparse
        return sketch
    if encoding == _DENSE:
        if len(body) != 1 << p:
            raise ValueError(
                f"dense HyperLogLog state of precision {p} is {len(body)} bytes, not {1 << p}"
            )
        dense = np.frombuffer(body, dtype=np.uint8).copy()
        if int(dense.max(initial=0)) > q + 1:
            raise ValueError("dense HyperLogLog state has a register value out of range")
        sketch._sparse = None
        sketch._dense = dense
        return sketch
    raise ValueError(f"unknown HyperLogLog state encoding {encoding}")


def add_values(values: Iterable[bytes], p: int = PRECISION) -> bytes:
    """The serialized sketch of ``values``."""
    sketch = Sketch(p)
    for v in values:
        sketch.add(v)
    return sketch.to_bytes()


def _arrays(state: bytes) -> tuple[int, np.ndarray, np.ndarray | None]:
    """A state as (precision, register indexes, values) when sparse, or (precision, dense
    registers, None). Stored states were validated when written (:func:`parse`)."""
    encoding, p = _HEADER.unpack_from(state)
    body = np.frombuffer(state, dtype=np.uint8, offset=_HEADER.size)
    if encoding == _DENSE:
        return p, body, None
    if encoding != _SPARSE:
        raise ValueError(f"unknown HyperLogLog state encoding {encoding}")
    entries = np.frombuffer(state, dtype=">u4", offset=_HEADER.size + 4).astype(np.int64)
    return p, entries >> _ENTRY_BITS, (entries & ((1 << _ENTRY_BITS) - 1)).astype(np.uint8)


def merge_states(newer: bytes, older: bytes) -> bytes:
    """The serialized union of two serialized sketches (vectorized: the memtable folds every
    hll write into its cell's state, so this runs once per write)."""
    p_new, a_regs, a_vals = _arrays(newer)
    p_old, b_regs, b_vals = _arrays(older)
    if p_new != p_old:
        raise ValueError(f"cannot merge HyperLogLog sketches of precision {p_new} and {p_old}")
    m = 1 << p_new
    if a_vals is None or b_vals is None:
        dense = np.zeros(m, dtype=np.uint8)
        for regs, vals in ((a_regs, a_vals), (b_regs, b_vals)):
            if vals is None:
                np.maximum(dense, regs, out=dense)
            else:
                np.maximum.at(dense, regs, vals)
        return _HEADER.pack(_DENSE, p_new) + dense.tobytes()
    regs = np.concatenate((a_regs, b_regs))
    vals = np.concatenate((a_vals, b_vals))
    order = np.lexsort((vals, regs))  # by index, then value: the last of a run is its max
    regs, vals = regs[order], vals[order]
    last = np.ones(len(regs), dtype=bool)
    last[:-1] = regs[1:] != regs[:-1]
    regs, vals = regs[last], vals[last]
    if len(regs) > m // 4:
        dense = np.zeros(m, dtype=np.uint8)
        dense[regs] = vals
        return _HEADER.pack(_DENSE, p_new) + dense.tobytes()
    entries = ((regs << _ENTRY_BITS) | vals.astype(np.int64)).astype(">u4")
    return _HEADER.pack(_SPARSE, p_new) + _U32.pack(len(regs)) + entries.tobytes()


def estimate(state: bytes) -> int:
    """The estimated distinct count of a serialized sketch (0 for an empty value)."""
    if not state:
        return 0
    return parse(state).estimate()
