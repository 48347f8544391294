"""The RPC payload codec (tabletstore.rpc.codec): registry, round trips, clear errors."""

from __future__ import annotations

import dataclasses
import time
from enum import IntEnum

import msgpack
import pytest

from tabletstore import errors, keys
from tabletstore.data import model
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.rpc.codec import Codec, decode_error, encode_error


class Color(IntEnum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Leaf:
    key: bytes
    n: int


@dataclasses.dataclass(frozen=True, slots=True)
class Everything:
    raw: bytes
    text: str
    big: int
    small: int
    ratio: float
    flag: bool
    nothing: None
    color: Color
    maybe_color: Color | None
    leaves: tuple[Leaf, ...]
    leaf_list: list[Leaf]
    child: Leaf | None
    by_key: dict[bytes, Leaf]
    colors: list[Color]
    tags: frozenset[str]
    pair: tuple[int, str]
    cells: tuple[keys.Cell, ...]
    nested_lists: list[list[int]]
    computed: int = dataclasses.field(init=False, default=0, compare=False)


@pytest.fixture
def codec() -> Codec:
    c = Codec()
    c.register(1, Leaf)
    c.register(2, Everything)
    return c


def _everything(child: Leaf | None) -> Everything:
    return Everything(
        raw=b"\x00\xff",
        text="héllo",
        big=2**64 - 1,
        small=-(2**63),
        ratio=0.25,
        flag=True,
        nothing=None,
        color=Color.BLUE,
        maybe_color=Color.RED,
        leaves=(Leaf(b"a", 1), Leaf(b"b", 2)),
        leaf_list=[Leaf(b"c", 3)],
        child=child,
        by_key={b"k": Leaf(b"k", 4)},
        colors=[Color.RED, Color.BLUE],
        tags=frozenset({"x", "y"}),
        pair=(7, "seven"),
        cells=(keys.Cell(b"r", "f", b"q", 10, 1, int(keys.CellKind.PUT), b"v"),),
        nested_lists=[[1, 2], []],
    )


@pytest.mark.parametrize("child", [None, Leaf(b"x", 9)])
def test_round_trip_restores_types(codec: Codec, child: Leaf | None) -> None:
    value = _everything(child)
    got = codec.decode(codec.encode(value))
    assert got == value
    assert type(got.color) is Color and type(got.maybe_color) is Color
    assert type(got.leaf_list) is list and type(got.leaves) is tuple
    assert type(got.colors[0]) is Color
    assert type(got.cells[0]) is keys.Cell
    assert type(got.nested_lists) is list and type(got.nested_lists[0]) is list


def test_plain_values(codec: Codec) -> None:
    for value in (None, True, 0, -1, 2**63 - 1, 1.5, "s", b"b", {"a": 1}, {1: b"x"}):
        assert codec.decode(codec.encode(value)) == value
    # Outside typed fields, arrays decode as tuples.
    assert codec.decode(codec.encode([1, [2, Leaf(b"z", 0)]])) == (1, (2, Leaf(b"z", 0)))


def test_model_types_round_trip() -> None:
    c = Codec()
    c.register(10, model.Row)
    c.register(11, model.Cell)
    c.register(12, model.RowMutation)
    c.register(13, model.SetCell)
    c.register(14, model.DeleteRow)
    row = model.Row(b"r", [model.Cell("f", b"q", 5, b"v", ("lbl",))])
    got = c.decode(c.encode(row))
    assert got == row and type(got.cells) is list
    mutation = model.RowMutation(b"r", (model.SetCell("f", b"q", b"v", None), model.DeleteRow()))
    assert c.decode(c.encode(mutation)) == mutation


def test_unknown_type_id(codec: Codec) -> None:
    other = Codec()
    other.register(1, Leaf)
    data = codec.encode(_everything(None))
    with pytest.raises(InvalidArgument, match="unknown type id 2"):
        other.decode(data)


def test_field_count_mismatch() -> None:
    @dataclasses.dataclass(frozen=True)
    class LeafV2:
        key: bytes
        n: int
        extra: str

    old, new = Codec(), Codec()
    old.register(1, Leaf)
    new.register(1, LeafV2)
    with pytest.raises(InvalidArgument, match="expected 2 fields, got 3"):
        old.decode(new.encode(LeafV2(b"k", 1, "e")))


def test_encode_errors(codec: Codec) -> None:
    @dataclasses.dataclass
    class Unregistered:
        x: int

    with pytest.raises(InvalidArgument, match="not registered with the RPC codec"):
        codec.encode([Unregistered(1)])
    with pytest.raises(InvalidArgument, match=r"integer 18446744073709551616 .*-2\*\*63"):
        codec.encode(2**64)
    with pytest.raises(InvalidArgument, match="cannot encode object values"):
        codec.encode([1, object()])
    # The reused packer is clean after a failure.
    assert codec.decode(codec.encode([7])) == (7,)


@pytest.mark.parametrize(
    ("changes", "field", "annotation"),
    [
        ({"raw": "text"}, "raw", "bytes"),
        ({"text": b"raw"}, "text", "str"),
        ({"big": True}, "big", "int"),
        ({"small": 1.5}, "small", "int"),
        ({"ratio": "x"}, "ratio", "float"),
        ({"flag": 1}, "flag", "bool"),
        ({"nothing": 0}, "nothing", "NoneType"),
        ({"leaves": (Leaf(b"a", 1), 5)}, "leaves", "tuple"),
        ({"leaves": 5}, "leaves", "tuple"),
        ({"child": b"x"}, "child", r"Leaf \| None"),
        ({"by_key": {b"k": 1}}, "by_key", "dict"),
        ({"tags": frozenset({1})}, "tags", "frozenset"),
        ({"pair": (7, 8)}, "pair", "tuple"),
        ({"pair": (7, "seven", 1)}, "pair", "tuple"),
        ({"nested_lists": [[1, "2"]]}, "nested_lists", "list"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_decoded_fields_must_match_their_annotations(
    codec: Codec, changes: dict[str, object], field: str, annotation: str
) -> None:
    """A peer's value of the wrong type in a field is an InvalidArgument naming the class, the
    field and the annotation, not an object that fails later where it is used."""
    value = dataclasses.replace(_everything(None), **changes)  # type: ignore[arg-type]
    with pytest.raises(
        InvalidArgument, match=rf"Everything .* field '{field}' must be {annotation}"
    ):
        codec.decode(codec.encode(value))


def test_an_enum_value_out_of_range_is_an_invalid_argument(codec: Codec) -> None:
    value = dataclasses.replace(_everything(None), color=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="7 is not a valid Color"):
        codec.decode(codec.encode(value))


def test_every_wire_type_has_checkable_annotations() -> None:
    """Every registered message's hints resolve to checks (a hint the checker cannot read
    would fail the first decode of that message in production)."""
    from tabletstore.rpc.codec import _checks_for
    from tabletstore.rpc.wire import WIRE_FORMS, WIRE_TYPES

    for cls in WIRE_TYPES.values():
        if cls not in WIRE_FORMS:
            _checks_for(cls)


def test_decode_garbage(codec: Codec) -> None:
    for data in (b"\xc1", b"\x92\x01", b"\x01\x02"):
        with pytest.raises(InvalidArgument, match="cannot decode RPC payload"):
            codec.decode(data)


def test_register_validation(codec: Codec) -> None:
    codec.register(1, Leaf)  # the same registration again is a no-op
    with pytest.raises(InvalidArgument, match="already registered to Leaf"):
        codec.register(1, Everything)
    with pytest.raises(InvalidArgument, match="already registered as type id 1"):
        codec.register(3, Leaf)
    with pytest.raises(InvalidArgument, match=r"0\.\.127"):
        Codec().register(128, Leaf)
    with pytest.raises(InvalidArgument, match="only dataclasses"):
        codec.register(5, Color)


ERROR_CLASSES = [
    getattr(errors, n)
    for n in errors.__all__
    if isinstance(getattr(errors, n), type) and issubclass(getattr(errors, n), TabletStoreError)
]


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_errors_cross_by_code(cls: type[TabletStoreError]) -> None:
    """Every class of errors.__all__ has its own code and comes back as itself, with the
    flags that drive retries (retryable, may_have_applied)."""
    payload = encode_error(cls("it broke"))
    code, message = msgpack.unpackb(payload)
    assert code == errors.ERROR_CODES[cls] and message == "it broke"  # a code, not a name
    got = decode_error(payload)
    assert type(got) is cls and str(got) == "it broke"
    assert (got.retryable, got.may_have_applied) == (cls.retryable, cls.may_have_applied)


def test_golden_error_payload() -> None:
    # [code, message]: NotServing is code 11, as msgpack fixarray(2) [11, "x"].
    assert encode_error(errors.NotServing("x")) == bytes.fromhex("92 0b a1 78")
    assert errors.ErrorCode.NOT_SERVING == 11 and errors.ErrorCode.INDETERMINATE == 13


def test_every_error_class_has_one_code() -> None:
    assert set(errors.ERROR_CODES) == set(ERROR_CLASSES)
    assert len(set(errors.ERROR_CODES.values())) == len(ERROR_CLASSES)


def test_a_subclass_defined_elsewhere_travels_as_its_ancestor() -> None:
    class QuotaExceeded(errors.Unavailable):
        pass

    got = decode_error(encode_error(QuotaExceeded("over quota")))
    assert type(got) is errors.Unavailable and str(got) == "over quota"


def test_an_unknown_code_becomes_a_plain_error_naming_it() -> None:
    got = decode_error(msgpack.packb([999, "a newer peer's error"]))
    assert type(got) is TabletStoreError
    assert "999" in str(got) and "a newer peer's error" in str(got)
    assert not got.retryable and not got.may_have_applied
    assert "undecodable" in str(decode_error(b"\xc1"))
    assert "undecodable" in str(decode_error(msgpack.packb(["NotFound", "by name"])))


def test_typical_message_speed(codec: Codec) -> None:
    """Not a timed assertion: prints the cost of a 100-row batch for the record."""
    batch = tuple(Leaf(b"row%05d" % i, i) for i in range(100))
    data = codec.encode(batch)
    start = time.perf_counter()
    for _ in range(200):
        codec.decode(codec.encode(batch))
    per_round_trip = (time.perf_counter() - start) / 200
    print(f"100-row batch: {len(data)} bytes, {per_round_trip * 1e6:.0f} µs encode+decode")
    assert codec.decode(data) == batch


def test_point_reads_round_trip_every_kind_of_answer() -> None:
    """read_points' reply mixes row batches (their own wire form), LargeRow and EntryError in
    one tuple: each decodes back to its class."""
    from tabletstore.rpc import messages as m
    from tabletstore.rpc.wire import register_all

    c = register_all(Codec())
    rows = (
        model.Row(b"a", [model.Cell("f", b"q", 5, b"v")]),
        model.Row(b"b", [model.Cell("f", b"q", 5, b"v"), model.Cell("f", b"r", 4, b"w")]),
    )
    reply = m.PointReadsResponse(
        (m.RowBatch(rows), m.LargeRow(b"x", 10**7), m.EntryError(2, 13, "moved"), m.RowBatch(()))
    )
    got = c.decode(c.encode(reply))
    assert got == reply and [type(a) for a in got.answers] == [type(a) for a in reply.answers]
    request = m.PointReadsRequest((m.TabletKeys("t", "x", (b"a", b"b")),), identity="me")
    assert c.decode(c.encode(request)) == request
