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

Bad input is an InvalidArgument naming the problem: an unregistered class or an int out of range
on encode, an unknown type id or a field-count mismatch (a peer with another definition) on
decode, bytes that are not msgpack.
"""

from __future__ import annotations

import dataclasses
import enum
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
    "WireForm",
    "decode",
    "decode_error",
    "encode",
    "encode_error",
    "register",
]

_Convert = Callable[[Any], Any]
_MAX_TYPE_ID = 127  # msgpack's application extension codes are 0..127
_SCALARS = frozenset({bytes, str, int, float, bool, type(None), object})


@dataclasses.dataclass(frozen=True, slots=True)
class WireForm:
    """A registered class's own wire form: ``fields(obj)`` gives the values sent after its type
    marker (a tuple of encodable values), ``build(values)`` the instance back from them, raising
    ValueError or TypeError for values that do not fit (the codec reports InvalidArgument)."""

    fields: Callable[[Any], tuple[Any, ...]]
    build: Callable[[tuple[Any, ...]], Any]


class _Spec:
    """How one registered dataclass goes on and off the wire."""

    __slots__ = ("build", "cls", "converters", "encode", "form", "names", "type_id")

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
        self._by_cls[cls] = spec
        self._by_id[type_id] = spec
        self._encoders[cls] = spec.encode

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
        return spec.cls(*fields)

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
