"""A read request whose filter holds hundreds of regexes costs the worker what its first
few dozen do, not decoding all of them.

The attack of ``test_filter_cost.py`` at the decoder: a ReadRows request frame of about 270 KB
whose filter interleaves 500 heavy regexes. The worker decoded the whole frame, building all
500 regex filters (about 4 ms of Python on its event loop, the GIL held even in the decode
thread), before ``Interleave`` counted them and refused; sent back to back, that cost other
clients' latency. Now the decoder charges each filter to the message's
:class:`~tabletstore.data.filters.PartsBudget` before it builds it, and stops at the first
part over a limit: at most ``MAX_FILTER_REGEXES`` regex filters are ever built. The same for
the filter's nodes (``MAX_FILTER_NODES``) and pattern bytes (``MAX_FILTER_REGEX_BYTES``), and a
filter within every limit still decodes whole.
"""

from __future__ import annotations

from typing import Any

import pytest

from tabletstore.data import filters as f
from tabletstore.errors import InvalidArgument
from tabletstore.rpc import messages, wire
from tabletstore.rpc.codec import Codec
from tests.security.test_filter_cost import _unchecked, heavy_pattern, regex_flood


def _codec() -> Codec:
    return wire.register_all(Codec())


def _read(hostile: f.RowFilter) -> bytes:
    return _codec().encode(messages.ReadRowsRequest("t", "tablet", filter=hostile))


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many filters of each kind the decoder builds (their checks counted as they run)."""
    counts: dict[str, int] = {}
    for cls in (f.ValueRegex, f.ApplyLabel, f.Interleave):
        original = cls.__post_init__

        def counting(self: Any, original: Any = original) -> None:
            counts[self.kind] = counts.get(self.kind, 0) + 1
            original(self)

        monkeypatch.setattr(cls, "__post_init__", counting)
    return counts


def test_a_regex_flood_is_refused_after_building_at_most_the_limit(
    built: dict[str, int],
) -> None:
    payload = _read(regex_flood(500))
    assert len(payload) > 250_000
    with pytest.raises(InvalidArgument, match="MAX_FILTER_REGEXES=64"):
        _codec().decode(payload)
    assert built.get("value_regex", 0) <= f.MAX_FILTER_REGEXES, built
    assert "interleave" not in built, built


def test_a_node_flood_is_refused_after_building_at_most_the_limit(
    built: dict[str, int],
) -> None:
    many = _unchecked(f.Interleave, filters=(_unchecked(f.ApplyLabel, label="a"),) * 5000)
    with pytest.raises(InvalidArgument, match="MAX_FILTER_NODES=1000"):
        _codec().decode(_read(many))
    assert built.get("apply_label", 0) <= f.MAX_FILTER_NODES, built


def test_pattern_bytes_over_the_limit_are_refused_before_the_filter_is_built(
    built: dict[str, int],
) -> None:
    big = b"x" * 20_000  # each within its own limit, four over the filter's
    leaves = tuple(_unchecked(f.ValueRegex, pattern=big) for _ in range(8))
    many = _unchecked(f.Interleave, filters=leaves)
    with pytest.raises(InvalidArgument, match="MAX_FILTER_REGEX_BYTES=65536"):
        _codec().decode(_read(many))
    assert built.get("value_regex", 0) <= 3, built


def test_each_message_has_its_own_budget_and_a_filter_within_it_decodes_whole() -> None:
    codec = _codec()
    within = f.Interleave([f.ValueRegex(heavy_pattern(i)[:100]) for i in range(40)])
    payload = codec.encode(messages.ReadRowsRequest("t", "tablet", filter=within))
    for _ in range(3):  # 120 regexes over three messages: each is charged on its own
        assert codec.decode(payload).filter == within
    with pytest.raises(InvalidArgument, match="MAX_FILTER_REGEXES"):
        codec.decode(_read(regex_flood(65)))
    assert codec.decode(payload).filter == within  # a refusal leaves no charge behind
