"""Payload encoding for the RPC wire: msgpack with a registry of frozen dataclasses.

frames.py carries opaque payload bytes; this module turns values into those bytes and back. It
knows no message types itself: the layer that defines messages registers each class once under a
small integer id (``register(7, MutateRowRequest)``), the same id on every process.

Encoding (msgpack, ``use_bin_type``)::

    None, bool, int (-2**63 .. 2**64-1), float, str, bytes   msgpack's own types
    list, tuple, set, frozenset                              array
    dict                                                     map (keys of any packable type)
    IntEnum / other Enum                                     its value
    registered dataclass                                     ext(type_id, array of its fields)

A dataclass is an array whose first element is an empty msgpack *extension* whose type code is
the class's registered id (0..127), followed by its init fields in declaration order::

    dataclass := array(1 + n) [ ext(type_id, b""), field_1, ..., field_n ]

A class registered with a :class:`WireForm` is the same array with the values its ``fields``
function gives instead of its init fields, and is rebuilt by its ``build`` function (e.g. a
batch of rows sent column-wise, one array per cell field: ``rpc.row_pieces``).

The packer writes that array natively (one Python call per dataclass, no nested packing), and a
dataclass anywhere in a value (in a list, a dict, an ``X | None`` field) decodes back to its
class: only such arrays start with an extension.

Decoding restores what msgpack cannot say from a registered class's type hints: arrays decode as
tuples, and a field annotated ``list[...]``, ``set[...]``, ``frozenset[...]``, an Enum, a
NamedTuple (such as ``keys.Cell``) or a container of those is converted back, recursively, through
``X | None`` unions. Outside typed fields (the top-level value, ``Any``, unions of several
types) arrays stay tuples and enums stay plain values.

Errors cross the wire as ``[code, message]`` (``encode_error`` / ``decode_error``), the code
being the class's stable ``errors.ErrorCode`` (a subclass defined elsewhere sends its nearest
ancestor's); the receiver raises the class of that code, or a plain TabletStoreError naming a
code it does not know.

A :class:`DecodeBudget` (``Codec.set_budget``) charges the parts of one message, as they are
decoded and before each is built, to a budget of that message: the decode stops at the first
part over a limit, so a message of thousands of parts over a limit costs what its first few
hundred do, not building them all (``rpc/wire.py`` charges filters to
``data.filters.PartsBudget``).

Bad input is an InvalidArgument naming the problem: an unregistered class or an int out of range
on encode, an unknown type id or a field-count mismatch (a peer with another definition) on
decode, bytes that are not msgpack, and a field whose value does not fit its type hint (a peer's
request is not trusted to: see "type checks of decoded fields" below).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import itertools
import re
import threading
import types
import typing
from collections.abc import Callable
from typing import Any

import msgpack

from tabletstore.errors import InvalidArgument, TabletStoreError, error_code, error_from_code

__all__ = [
    "DEFAULT_CODEC",
    "Codec",
    "DecodeBudget",
    "WireForm",
    "decode",
    "decode_error",
    "encode",
    "encode_error",
    "register",
]

_Convert = Callable[[Any], Any]
_Check = Callable[[Any], bool]
_MAX_TYPE_ID = 127  # msgpack's application extension codes are 0..127
_SCALARS = frozenset({bytes, str, int, float, bool, type(None), object})


@dataclasses.dataclass(frozen=True, slots=True)
class WireForm:
    """A registered class's own wire form: ``fields(obj)`` gives the values sent after its type
    marker (a tuple of encodable values), ``build(values)`` the instance back from them, raising
    ValueError or TypeError for values that do not fit (the codec reports InvalidArgument)."""

    fields: Callable[[Any], tuple[Any, ...]]
    build: Callable[[tuple[Any, ...]], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeBudget:
    """What one decoded message may hold, charged part by part while it is decoded: ``new()``
    makes one message's budget, and ``charges`` maps registered classes to a function
    ``charge(budget, fields)`` that charges an instance about to be built from ``fields`` (as
    received, unchecked) and raises InvalidArgument past a limit, which ends the decode there."""

    new: Callable[[], Any]
    charges: collections.abc.Mapping[type, Callable[[Any, tuple[Any, ...]], None]]


class _Spec:
    """How one registered dataclass goes on and off the wire."""

    __slots__ = (
        "build",
        "charge",
        "checks",
        "cls",
        "converters",
        "encode",
        "form",
        "names",
        "type_id",
    )

    def __init__(self, type_id: int, cls: type, form: WireForm | None = None) -> None:
        self.type_id = type_id
        self.cls = cls
        self.form = form
        self.names = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        marker = msgpack.ExtType(type_id, b"")
        if form is None:
            self.encode = _array_encoder(marker, self.names)
            self.build: Callable[[tuple[Any, ...]], Any] | None = None
        else:
            fields = form.fields
            self.encode = lambda o: (marker, *fields(o))
            self.build = form.build
        # Per-field converters from the type hints, resolved on first decode (so classes may
        # be registered before the classes their hints name are defined). None = identity.
        self.converters: tuple[_Convert | None, ...] | None = None
        # Per-field type checks from the same hints (after conversion), resolved likewise:
        # (field index, field name, check, the annotation as written).
        self.checks: _FieldChecks | None = None
        # The DecodeBudget's charge for this class (Codec.set_budget); None: not charged.
        self.charge: Callable[[Any, tuple[Any, ...]], None] | None = None


def _array_encoder(marker: msgpack.ExtType, names: tuple[str, ...]) -> Callable[[Any], Any]:
    """``lambda o: (marker, o.f1, ..., o.fn)``, generated once per class (as dataclasses
    generates ``__init__``): the hot path of encoding, about twice as fast as attrgetter."""
    for name in names:
        if not name.isidentifier():
            raise InvalidArgument(f"field name {name!r} is not an identifier")
    body = "".join(f", o.{name}" for name in names)
    encoder: Callable[[Any], Any] = eval(f"lambda o: (M{body},)", {"M": marker})
    return encoder


class Codec:
    """A registry of dataclasses plus the msgpack encode/decode that uses it."""

    def __init__(self) -> None:
        self._by_cls: dict[type, _Spec] = {}
        self._by_id: dict[int, _Spec] = {}
        # cls -> _Spec.encode, looked up on every dataclass instance encoded.
        self._encoders: dict[type, Callable[[Any], Any]] = {}
        # One reusable Packer per thread (msgpack.packb would build one, with its buffer,
        # per call); a Packer is not safe to share between threads.
        self._packers = threading.local()
        # The DecodeBudget (set_budget), and the budget of the message each thread decodes
        # (made at its first charged part, dropped when its decode ends).
        self._budget: DecodeBudget | None = None
        self._decoding = threading.local()

    def register(self, type_id: int, cls: type, form: WireForm | None = None) -> None:
        """Make ``cls`` (a dataclass, frozen by convention) encodable under ``type_id``, as its
        init fields or, with ``form``, as the values ``form`` gives (module docstring).

        Registering the same class under the same id again is a no-op; any other reuse of an id
        or a class is an InvalidArgument.
        """
        if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
            raise InvalidArgument(f"only dataclasses can be registered, got {cls!r}")
        if isinstance(type_id, bool) or not isinstance(type_id, int):
            raise InvalidArgument(f"type id must be an int, got {type_id!r}")
        if not 0 <= type_id <= _MAX_TYPE_ID:
            raise InvalidArgument(f"type id must be in 0..{_MAX_TYPE_ID}, got {type_id}")
        known = self._by_id.get(type_id)
        if known is not None and known.cls is cls:
            return
        if known is not None:
            raise InvalidArgument(
                f"type id {type_id} is already registered to {known.cls.__qualname__}"
            )
        if cls in self._by_cls:
            raise InvalidArgument(
                f"{cls.__qualname__} is already registered as type id {self._by_cls[cls].type_id}"
            )
        spec = _Spec(type_id, cls, form)
        if self._budget is not None:
            spec.charge = self._budget.charges.get(cls)
        self._by_cls[cls] = spec
        self._by_id[type_id] = spec
        self._encoders[cls] = spec.encode

    def set_budget(self, budget: DecodeBudget) -> None:
        """Charge every message this codec decodes to ``budget`` (module docstring); each
        class it charges must be registered already."""
        for cls in budget.charges:
            if cls not in self._by_cls:
                raise InvalidArgument(f"cannot charge {cls.__qualname__}: it is not registered")
        for spec in self._by_id.values():
            spec.charge = budget.charges.get(spec.cls)
        self._budget = budget

    # -- encode -------------------------------------------------------------------------------

    def encode(self, value: object) -> bytes:
        """``value`` as msgpack bytes. Raises InvalidArgument for what cannot be encoded."""
        packer = getattr(self._packers, "packer", None)
        if packer is None:
            packer = self._packers.packer = msgpack.Packer(
                default=self._default, use_bin_type=True, autoreset=True
            )
        try:
            data: bytes = packer.pack(value)
        except InvalidArgument:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgument(f"cannot encode {type(value).__name__} for RPC: {exc}") from exc
        return data

    def _default(self, obj: Any) -> Any:
        """msgpack's hook for anything that is not a plain msgpack type."""
        encoder = self._encoders.get(type(obj))
        if encoder is not None:
            return encoder(obj)
        if isinstance(obj, enum.Enum):
            return obj.value
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        if dataclasses.is_dataclass(obj):
            raise InvalidArgument(
                f"cannot encode {type(obj).__qualname__}: it is not registered with the RPC "
                f"codec (codec.register(type_id, {type(obj).__name__}))"
            )
        if isinstance(obj, int):
            raise InvalidArgument(
                f"cannot encode the integer {obj} for RPC: msgpack holds -2**63 .. 2**64-1"
            )
        raise InvalidArgument(f"cannot encode {type(obj).__qualname__} values for RPC")

    # -- decode -------------------------------------------------------------------------------

    def decode(self, data: bytes | memoryview) -> Any:
        """The value ``data`` encodes. Raises InvalidArgument for bytes it cannot decode."""
        try:
            value = msgpack.unpackb(
                data,
                ext_hook=self._ext_hook,
                list_hook=self._list_hook,
                use_list=False,
                raw=False,
                strict_map_key=False,
            )
        except InvalidArgument:
            raise
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise InvalidArgument(f"cannot decode RPC payload: {exc!r}") from exc
        finally:
            if self._budget is not None:
                self._decoding.budget = None  # the next message starts afresh
        if type(value) is _Spec:
            raise InvalidArgument("cannot decode RPC payload: a type marker outside an array")
        return value

    def _ext_hook(self, code: int, data: bytes) -> _Spec:
        """An ext is the marker opening a dataclass's array; _list_hook builds the instance."""
        spec = self._by_id.get(code)
        if spec is None:
            raise InvalidArgument(
                f"cannot decode RPC payload: unknown type id {code} (registered: "
                f"{sorted(self._by_id) or 'none'}); do both sides run the same version?"
            )
        if data:
            raise InvalidArgument(f"cannot decode RPC payload: type marker {code} carries data")
        return spec

    def _list_hook(self, items: tuple[Any, ...]) -> Any:
        if not items or type(items[0]) is not _Spec:
            return items
        spec: _Spec = items[0]
        fields = items[1:]
        if spec.charge is not None:
            spec.charge(self._message_budget(), fields)
        if spec.build is not None:
            try:
                return spec.build(fields)
            except (ValueError, TypeError) as exc:
                raise InvalidArgument(
                    f"cannot decode {spec.cls.__qualname__} (type id {spec.type_id}): {exc}; "
                    f"do both sides run the same version?"
                ) from exc
        if len(fields) != len(spec.names):
            raise InvalidArgument(
                f"cannot decode {spec.cls.__qualname__} (type id {spec.type_id}): expected "
                f"{len(spec.names)} fields, got {len(fields)}; do both sides run the same "
                f"version?"
            )
        converters = spec.converters
        if converters is None:
            converters = spec.converters = self._converters_for(spec.cls)
        if converters:
            fields = tuple(
                v if c is None or v is None else c(v)
                for c, v in zip(converters, fields, strict=True)
            )
        checks = spec.checks
        if checks is None:
            checks = spec.checks = _checks_for(spec.cls)
        if not checks.all_pass(fields):
            for index, name, check, annotation in checks.each:
                value = fields[index]
                if not check(value):
                    raise InvalidArgument(
                        f"cannot decode {spec.cls.__qualname__} (type id {spec.type_id}): "
                        f"field {name!r} must be {annotation}, got {_describe(value)}"
                    )
        return spec.cls(*fields)

    def _message_budget(self) -> Any:
        """The budget of the message this thread is decoding (made at its first charge)."""
        budget = getattr(self._decoding, "budget", None)
        if budget is None:
            assert self._budget is not None  # a spec has a charge only once one is set
            budget = self._decoding.budget = self._budget.new()
        return budget

    def _converters_for(self, cls: type) -> tuple[_Convert | None, ...]:
        """Per-init-field converters; () when every field decodes as msgpack gives it."""
        try:
            hints = typing.get_type_hints(cls)
        except (NameError, TypeError) as exc:
            raise InvalidArgument(
                f"cannot resolve the type hints of {cls.__qualname__} for RPC decoding: {exc}"
            ) from exc
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        converters = tuple(_converter(hints.get(name, Any)) for name in names)
        return converters if any(c is not None for c in converters) else ()


def _converter(tp: Any) -> _Convert | None:
    """A function restoring a decoded value of annotated type ``tp``; None if nothing to do."""
    if tp is Any or tp in _SCALARS:
        return None
    origin = typing.get_origin(tp)
    if origin is None:
        return _class_converter(tp) if isinstance(tp, type) else None
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _converter(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return _optional_converter(args)
    if origin is list or origin is set or origin is frozenset:
        return _collection_converter(origin, _converter(args[0]) if args else None)
    if origin is tuple:
        return _tuple_converter(args)
    if origin is dict:
        return _dict_converter(args)
    return None


def _class_converter(cls: type) -> _Convert | None:
    if issubclass(cls, enum.Enum):
        return cls
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a NamedTuple such as keys.Cell
        return _namedtuple_converter(cls)
    if cls is list or cls is set or cls is frozenset:
        return cls
    return None  # scalars, dataclasses (self-describing), tuple, dict: as decoded


def _namedtuple_converter(cls: type) -> _Convert:
    hints = typing.get_type_hints(cls)
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    converters = [_converter(hints.get(name, Any)) for name in fields]
    if all(c is None for c in converters):
        return lambda v: cls(*v)
    return lambda v: cls(
        *(x if c is None or x is None else c(x) for c, x in zip(converters, v, strict=True))
    )


def _optional_converter(args: tuple[Any, ...]) -> _Convert | None:
    members = [a for a in args if a is not type(None)]
    if len(members) != 1:
        return None  # an ambiguous union decodes as msgpack gives it
    member = _converter(members[0])
    return None if member is None else (lambda v: None if v is None else member(v))


def _collection_converter(origin: type, item: _Convert | None) -> _Convert:
    if item is None:
        return origin
    return lambda v: origin(item(x) for x in v)


def _tuple_converter(args: tuple[Any, ...]) -> _Convert | None:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])
        return None if item is None else (lambda v: tuple(item(x) for x in v))
    converters = [_converter(a) for a in args]
    if all(c is None for c in converters):
        return None
    return lambda v: tuple(x if c is None else c(x) for c, x in zip(converters, v, strict=True))


def _dict_converter(args: tuple[Any, ...]) -> _Convert | None:
    if len(args) != 2:
        return None
    key, value = _converter(args[0]), _converter(args[1])
    if key is None and value is None:
        return None
    k = key or (lambda x: x)
    v = value or (lambda x: x)
    return lambda d: {k(a): v(b) for a, b in d.items()}


# -- type checks of decoded fields ------------------------------------------------------------
#
# A peer is not trusted to send what a field's annotation says: msgpack decodes whatever it was
# given, so without these a request could put a bool where a timestamp goes, a string where a
# row key goes, or a number where a tuple of mutations goes, and the handler would fail deep
# inside (an internal error) or, worse, store it. Checked once per decoded dataclass, after the
# converters; ``int`` excludes bool (msgpack keeps them apart, and a bool is never an int
# field's value), ``float`` takes ints too (``5`` for ``5.0``).


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldChecks:
    """One class's checks: ``all_pass(fields)``, one generated expression over the fields (the
    hot path: about 0.1 µs for a SetCell), and ``each`` (index, name, check, annotation) to
    name the field that failed."""

    all_pass: Callable[[tuple[Any, ...]], bool]
    each: tuple[tuple[int, str, _Check, str], ...]


def _checks_for(cls: type) -> _FieldChecks:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    each = []
    env: dict[str, Any] = {"repeat": itertools.repeat}
    terms = []
    for index, name in enumerate(names):
        tp = hints.get(name, Any)
        check = _check(tp)
        if check is None:
            continue
        each.append((index, name, check, _annotation(tp)))
        term = _expression(tp, f"f[{index}]", env)
        if term is None:  # no inline form: call the check
            env[f"K{index}"] = check
            term = f"K{index}(f[{index}])"
        terms.append(f"({term})")
    source = f"lambda f: {' and '.join(terms) or 'True'}"
    all_pass: Callable[[tuple[Any, ...]], bool] = eval(source, env)  # built from type hints only
    return _FieldChecks(all_pass, tuple(each))


def _expression(tp: Any, var: str, env: dict[str, Any]) -> str | None:
    """``tp``'s check as a Python expression over ``var`` (names it needs go in ``env``), or
    None when it has no inline form."""
    members = _flat_members(tp)
    if members is not None:
        scalars, classes = members
        parts = []
        if type(None) in scalars:
            parts.append(f"{var} is None")
        exact = [t for t in scalars if t is not type(None)]
        if len(exact) == 1:
            parts.append(f"type({var}) is {_name(exact[0], env)}")
        elif exact:
            parts.append(f"type({var}) in {_name(frozenset(exact), env)}")
        if classes:
            parts.append(f"isinstance({var}, {_name(_one(classes), env)})")
        return " or ".join(parts)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        items = _flat_members(args[0])
        if items is None:
            return None
        scalars, classes = items
        if not classes:  # every item one of some exact types: one pass in C
            return f"type({var}) is tuple and {{*map(type, {var})}} <= {_name(frozenset(scalars), env)}"
        if not scalars:
            return (
                f"type({var}) is tuple and all(map(isinstance, {var}, "
                f"repeat({_name(_one(classes), env)})))"
            )
    return None


def _flat_members(tp: Any) -> tuple[list[type], list[type]] | None:
    """A scalar, a plain class or a union of those: (exact scalar types, classes), float
    standing for float and int; None for anything else."""
    origin = typing.get_origin(tp)
    members = typing.get_args(tp) if origin is typing.Union or origin is types.UnionType else (tp,)
    scalars: list[type] = []
    classes: list[type] = []
    for m in members:
        if m in _SCALAR_CHECKS:
            scalars += [float, int] if m is float else [m]
        elif isinstance(m, type) and typing.get_origin(m) is None:
            classes.append(m)
        else:
            return None
    return scalars, classes


def _one(classes: list[type]) -> type | tuple[type, ...]:
    return classes[0] if len(classes) == 1 else tuple(classes)


def _name(value: object, env: dict[str, Any]) -> str:
    name = f"C{len(env)}"
    env[name] = value
    return name


def _exact(*types_: type) -> _Check:
    allowed = frozenset(types_)
    return lambda v: type(v) in allowed


_SCALAR_CHECKS: dict[Any, _Check] = {
    int: _exact(int),
    bool: _exact(bool),
    float: _exact(float, int),
    str: _exact(str),
    bytes: _exact(bytes),
    type(None): _exact(type(None)),
}


def _check(tp: Any) -> _Check | None:
    """A predicate a decoded value of annotated type ``tp`` must pass; None: anything goes."""
    if tp is Any or tp is object:
        return None
    scalar = _SCALAR_CHECKS.get(tp)
    if scalar is not None:
        return scalar
    origin = typing.get_origin(tp)
    if origin is None:
        return (lambda v: isinstance(v, tp)) if isinstance(tp, type) else None
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _check(args[0])
    if origin is typing.Literal:
        return lambda v: any(type(v) is type(a) and v == a for a in args)
    if origin is typing.Union or origin is types.UnionType:
        members = [_check(a) for a in args]
        if any(m is None for m in members):
            return None
        checks = [m for m in members if m is not None]
        return lambda v: any(c(v) for c in checks)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _items_check(tuple, _check(args[0]))
        if args == ((),):  # tuple[()]
            return lambda v: v == ()
        parts = [_check(a) for a in args]
        return lambda v: (
            type(v) is tuple
            and len(v) == len(parts)
            and all(c is None or c(x) for c, x in zip(parts, v, strict=True))
        )
    if origin is dict or origin is collections.abc.Mapping:
        key = _check(args[0]) if args else None
        value = _check(args[1]) if len(args) == 2 else None
        return lambda v: (
            isinstance(v, origin)
            and all((key is None or key(a)) and (value is None or value(b)) for a, b in v.items())
        )
    if isinstance(origin, type) and issubclass(origin, collections.abc.Iterable):
        return _items_check(origin, _check(args[0]) if args else None)
    return None


def _items_check(container: type, item: _Check | None) -> _Check:
    if item is None:
        return lambda v: isinstance(v, container)

    def check(v: Any) -> bool:
        if not isinstance(v, container):
            return False
        return all(item(x) for x in typing.cast("collections.abc.Iterable[Any]", v))

    return check


_QUALIFIED = re.compile(r"\b(?:\w+\.)+(\w+)")


def _annotation(tp: Any) -> str:
    if isinstance(tp, type) and typing.get_origin(tp) is None:
        return tp.__qualname__
    return _QUALIFIED.sub(r"\1", str(tp))  # tuple[data.model.SetCell, ...] -> tuple[SetCell, ...]


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:40] + '...'}"


# -- errors across the wire -------------------------------------------------------------------


def encode_error(exc: TabletStoreError) -> bytes:
    """An ERROR payload: ``[code, message]``, the code from ``errors.ERROR_CODES``."""
    data: bytes = msgpack.packb([int(error_code(exc)), str(exc)], use_bin_type=True)
    return data


def decode_error(data: bytes | memoryview) -> TabletStoreError:
    """The exception an ERROR payload describes (never raises: a bad payload is described)."""
    try:
        code, message = msgpack.unpackb(data, raw=False)
        if isinstance(code, bool) or not isinstance(code, int):
            raise TypeError(f"error code {code!r} is not an integer")
        message = str(message)
    except Exception as exc:  # any garbage: report it rather than fail the caller differently
        return TabletStoreError(f"undecodable RPC error payload: {exc!r}")
    return error_from_code(code, message)


DEFAULT_CODEC = Codec()
register = DEFAULT_CODEC.register
encode = DEFAULT_CODEC.encode
decode = DEFAULT_CODEC.decode
