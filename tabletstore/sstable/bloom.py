"""Bloom filters over SSTable keys: skip the block fetch for rows an SSTable lacks (§6).

"A Bloom filter allows us to ask whether an SSTable might contain any data for a specified
row/column pair" (§6 "Bloom filters"). An SSTable's filter lives in its footer and is held in
memory from open, so a read of an absent row costs no request at all.

Construction is the classic one with double hashing (Kirsch & Mitzenmacher): one 128-bit
BLAKE2b digest of the key gives ``h1`` and ``h2`` (64 bits each) and probe ``i`` sets bit
``(h1 + i * h2) mod m``. With ``b`` bits per key the filter uses ``k = round(b * ln 2)`` probes
(clamped to 1..30), which for the default 10 bits per key gives about a 1% false-positive rate.
Building hashes in Python and sets bits with numpy; a query is pure Python (k probes).

Serialized form (little endian), part of the SSTable format (``format.py``)::

    u8  version (= 1)
    u8  k, the number of probes
    u16 reserved (= 0)
    u64 m, the number of bits (a multiple of 8, at least 64)
    m/8 bytes: the bit array, bit j is (byte[j >> 3] >> (j & 7)) & 1
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable

import numpy as np

from tabletstore.errors import Corruption, InvalidArgument

__all__ = ["DEFAULT_BITS_PER_KEY", "BloomFilter"]

#: About a 1% false-positive rate.
DEFAULT_BITS_PER_KEY = 10

_HEADER = struct.Struct("<BBHQ")
_VERSION = 1
_MIN_BITS = 64
_MAX_PROBES = 30
_MASK64 = (1 << 64) - 1
#: A digest's two little-endian 64-bit halves.
_HALVES = struct.Struct("<QQ")
_blake2b = hashlib.blake2b


def _hash_pair(key: bytes) -> tuple[int, int]:
    h = int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "little")
    # The digest's two little-endian halves. An odd step is never 0, so the k probes never
    # collapse onto one bit.
    return h & _MASK64, (h >> 64) | 1


class BloomFilter:
    """An immutable bloom filter: build with :meth:`build`, load with :meth:`from_bytes`."""

    __slots__ = ("_bits", "_k", "_m")

    def __init__(self, bits: bytes, probes: int) -> None:
        """``bits`` is the bit array (``len(bits) * 8`` bits); use :meth:`build` to make one."""
        if not bits or probes < 1 or probes > _MAX_PROBES:
            raise InvalidArgument(
                f"bloom filter needs a non-empty bit array and 1-{_MAX_PROBES} probes, "
                f"got {len(bits)} bytes and {probes} probes"
            )
        self._bits = bits
        self._k = probes
        self._m = len(bits) * 8

    @classmethod
    def build(cls, keys: Iterable[bytes], bits_per_key: int = DEFAULT_BITS_PER_KEY) -> BloomFilter:
        """A filter holding every key of ``keys`` (duplicates are harmless)."""
        if bits_per_key < 1 or bits_per_key > 64:
            raise InvalidArgument(f"bloom bits_per_key must be in 1..64, got {bits_per_key}")
        digests = b"".join([hashlib.blake2b(key, digest_size=16).digest() for key in keys])
        hashes = np.frombuffer(digests, dtype="<u8").reshape(-1, 2)
        probes = min(_MAX_PROBES, max(1, round(bits_per_key * math.log(2))))
        nbits = max(_MIN_BITS, len(hashes) * bits_per_key)
        nbits = (nbits + 7) // 8 * 8
        bitmap = np.zeros(nbits // 8, dtype=np.uint8)
        if len(hashes):
            # The same h1, h2 as _hash_pair: the digest's two little-endian halves, h2 made odd.
            h1 = hashes[:, 0].astype(np.uint64)
            h2 = hashes[:, 1].astype(np.uint64) | np.uint64(1)
            m = np.uint64(nbits)
            for i in range(probes):
                # uint64 arithmetic wraps modulo 2**64, exactly like the masked Python query.
                pos = (h1 + np.uint64(i) * h2) % m
                np.bitwise_or.at(
                    bitmap,
                    (pos >> np.uint64(3)).astype(np.intp),
                    np.left_shift(np.uint8(1), (pos & np.uint64(7)).astype(np.uint8)),
                )
        return cls(bitmap.tobytes(), probes)

    @classmethod
    def match_all(cls) -> BloomFilter:
        """A filter that may contain every key (all bits set): no false negatives, no use
        for lookups; for SSTables that are only ever read whole."""
        return cls(b"\xff" * (_MIN_BITS // 8), 1)

    def may_contain(self, key: bytes) -> bool:
        """False means ``key`` is certainly absent; True means it may be present."""
        # _hash_pair inlined (a call and a tuple less on every point read).
        h, h2 = _HALVES.unpack(_blake2b(key, digest_size=16).digest())
        h2 |= 1
        bits, m = self._bits, self._m
        for _ in range(self._k):
            # h is h1 + i * h2 modulo 2**64 at probe i.
            pos = h % m
            if not bits[pos >> 3] & (1 << (pos & 7)):
                return False
            h = (h + h2) & _MASK64
        return True

    @property
    def probes(self) -> int:
        return self._k

    @property
    def nbits(self) -> int:
        return self._m

    def to_bytes(self) -> bytes:
        """The serialized form (see the module docstring)."""
        return _HEADER.pack(_VERSION, self._k, 0, self._m) + self._bits

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        """Inverse of :meth:`to_bytes`; Corruption if ``data`` is not a valid filter."""
        if len(data) < _HEADER.size:
            raise Corruption(f"bloom filter of {len(data)} bytes is shorter than its header")
        version, probes, _reserved, nbits = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        if version != _VERSION:
            raise Corruption(f"bloom filter version {version} is not {_VERSION}")
        if nbits != len(body) * 8 or nbits < _MIN_BITS or not 1 <= probes <= _MAX_PROBES:
            raise Corruption(
                f"bloom filter header (k={probes}, m={nbits}) does not match its "
                f"{len(body)}-byte bit array"
            )
        return cls(bytes(body), probes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BloomFilter):
            return NotImplemented
        return self._k == other._k and self._bits == other._bits

    def __hash__(self) -> int:
        return hash((self._k, self._bits))

    def __repr__(self) -> str:
        return f"BloomFilter(m={self._m}, k={self._k})"
