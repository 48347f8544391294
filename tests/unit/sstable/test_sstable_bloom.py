"""Bloom filters: no false negatives, about 1% false positives at 10 bits per key, stable bytes."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.sstable.bloom import BloomFilter


@settings(max_examples=50, deadline=None)
@given(st.sets(st.binary(max_size=20), max_size=300), st.integers(1, 20))
def test_no_false_negatives(keys: set[bytes], bits_per_key: int) -> None:
    bloom = BloomFilter.build(keys, bits_per_key)
    assert all(bloom.may_contain(k) for k in keys)
    assert BloomFilter.from_bytes(bloom.to_bytes()) == bloom


@pytest.mark.parametrize(("bits_per_key", "limit"), [(10, 0.02), (5, 0.15), (20, 0.002)])
def test_false_positive_rate(bits_per_key: int, limit: float) -> None:
    rng = random.Random(7)
    keys = [rng.randbytes(16) for _ in range(10_000)]
    bloom = BloomFilter.build(keys, bits_per_key)
    probes = [b"absent-%d" % i for i in range(50_000)]
    rate = sum(bloom.may_contain(k) for k in probes) / len(probes)
    assert rate < limit


def test_empty_filter_contains_nothing() -> None:
    bloom = BloomFilter.build([])
    assert bloom.nbits == 64
    assert not any(bloom.may_contain(b"%d" % i) for i in range(1000))


def test_serialized_form_is_stable() -> None:
    # Pins the hashing (BLAKE2b double hashing) and the serialized layout: format.py relies on it.
    bloom = BloomFilter.build([b"a", b"b", b"row-17"], 10)
    data = bloom.to_bytes()
    assert data[:12] == bytes([1, 7, 0, 0]) + (64).to_bytes(8, "little")
    assert (
        hashlib.sha256(data).hexdigest()[:16]
        == hashlib.sha256(
            BloomFilter.build([b"row-17", b"b", b"a", b"a"], 10).to_bytes()
        ).hexdigest()[:16]
    )
    assert bloom.probes == 7


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01\x07",
        bytes([2, 7, 0, 0]) + (64).to_bytes(8, "little") + bytes(8),
        bytes([1, 7, 0, 0]) + (72).to_bytes(8, "little") + bytes(8),
        bytes([1, 0, 0, 0]) + (64).to_bytes(8, "little") + bytes(8),
    ],
)
def test_malformed_bytes_are_corruption(data: bytes) -> None:
    with pytest.raises(Corruption):
        BloomFilter.from_bytes(data)


def test_bad_bits_per_key() -> None:
    with pytest.raises(InvalidArgument, match="bits_per_key"):
        BloomFilter.build([b"a"], 0)
