"""The ``cbt`` command-line syntax: arguments parsed into API values, results formatted as text.

The ``tabletstore`` command mirrors Google's ``cbt`` tool (its verbs, its ``key=value``
arguments and its output), so this module owns that syntax as pure functions; :mod:`cli`
only does I/O. Every parse error is an :class:`InvalidArgument` whose message names the bad
argument, as cbt's do ("unknown arg key", "Bad set arg").

Bytes on the command line (as cbt): row keys, qualifiers and values are the raw bytes of the
argument (:func:`arg_bytes`), so a shell's ``$'\\x00\\xff'`` quoting passes binary. A NUL byte
cannot be passed in a command-line argument at all (neither in cbt); use ``import`` for that.

Garbage-collection policies (§2 "Timestamps"; cbt's ``setgcpolicy``)::

    never | maxversions=N | maxage=D | POLICY (and|&&) POLICY | POLICY (or|||) POLICY | (POLICY)

where ``D`` is a number with a unit ``ms``, ``s``, ``m``, ``h`` or ``d`` (``1h30m`` too).
cbt reads ``a or b and c`` left to right; rather than guess, mixing ``and`` with ``or`` at one
level needs parentheses here. They print as cbt prints them: ``(age() > 1d || versions() > 3)``;
``never`` prints as an empty policy.

Columns (cbt's ``columns=``): ``fam:qual`` selects a column, ``fam:`` a whole family, ``qual`` or
``:qual`` a qualifier in any family. Both parts are RE2 regular expressions matching the whole
name (cbt's FamilyFilter and ColumnFilter), so ``columns=anchor:`` reads the anchor family.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence

from tabletstore.data import hll
from tabletstore.data.filters import (
    CellsPerColumnLimit,
    Chain,
    ColumnQualifierRegex,
    FamilyNameRegex,
    Interleave,
    RowFilter,
    RowKeyRegex,
)
from tabletstore.data.model import AddToCell, Row, SetCell
from tabletstore.data.schema import (
    HISTORY_OFF,
    ColumnFamily,
    GcRule,
    IntersectionRule,
    MaxAgeRule,
    MaxVersionsRule,
    TableSchema,
    UnionRule,
)
from tabletstore.errors import InvalidArgument

__all__ = [
    "ROW_RULE",
    "arg_bytes",
    "column_filter",
    "family",
    "format_duration",
    "format_gc_rule",
    "format_row",
    "format_timestamp",
    "go_quote",
    "parse_bool",
    "parse_count",
    "parse_duration",
    "parse_families",
    "parse_gc_policy",
    "parse_kv_args",
    "parse_set_arg",
    "printable_key",
    "read_filter",
    "schema_lines",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_TOKEN = re.compile(r"\(|\)|&&|\|\||[^\s()&|]+")
_TIMESTAMP = re.compile(r"[+-]?\d+")
#: cbt prints rows this way: a rule of 40 dashes, the key, then each cell.
ROW_RULE = "-" * 40


def arg_bytes(text: str) -> bytes:
    """The bytes of a command-line argument exactly as the shell passed them.

    Python decodes ``argv`` with ``surrogateescape``, so bytes that are not UTF-8 come back
    unchanged here."""
    return text.encode("utf-8", "surrogateescape")


def parse_kv_args(args: Iterable[str], allowed: Sequence[str]) -> dict[str, str]:
    """cbt's optional ``key=value`` arguments; an unknown key or a bare word is an error."""
    out: dict[str, str] = {}
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq:
            raise InvalidArgument(f"bad argument {arg!r}: expected key=value")
        if key not in allowed:
            raise InvalidArgument(f"unknown arg key {key!r} (expected one of {', '.join(allowed)})")
        out[key] = value
    return out


def parse_count(key: str, value: str, *, minimum: int = 1) -> int:
    """A whole number argument such as ``count=10``."""
    try:
        n = int(value)
    except ValueError:
        raise InvalidArgument(f"{key}={value!r} is not a whole number") from None
    if n < minimum:
        raise InvalidArgument(f"{key} must be at least {minimum}, not {n}")
    return n


def parse_bool(key: str, value: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no) as cbt's boolean flags."""
    lowered = value.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"{key}={value!r} must be true or false")


# -- set --------------------------------------------------------------------------------------
def parse_set_arg(arg: str) -> SetCell:
    """``family:qualifier=value[@timestamp]`` as cbt's ``set``.

    The timestamp is microseconds since the epoch; when what follows the last ``@`` is not an
    integer, it is part of the value (as cbt does)."""
    column, eq, value = arg.partition("=")
    family, colon, qualifier = column.partition(":")
    if not eq or not colon or not family:
        raise InvalidArgument(f"bad set arg {arg!r}: expected family:column=value[@timestamp]")
    timestamp: int | None = None
    head, at, tail = value.rpartition("@")
    if at and _TIMESTAMP.fullmatch(tail):
        value, timestamp = head, int(tail)
    return SetCell(family, arg_bytes(qualifier), arg_bytes(value), timestamp)


# -- garbage-collection policies ---------------------------------------------------------------
def parse_duration(text: str) -> float:
    """``30d``, ``1h``, ``10m``, ``5s``, ``250ms``, ``1h30m`` → seconds (> 0)."""
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise InvalidArgument(
                f"bad duration {text!r}: expected a number with a unit ms, s, m, h or d "
                "(e.g. 30d, 1h, 10m, 5s)"
            )
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if total <= 0:
        raise InvalidArgument(f"bad duration {text!r}: must be greater than zero")
    return total


def format_duration(seconds: float) -> str:
    """The largest whole unit: 864000 → ``10d``, 5400 → ``90m``, 1.5 → ``1500ms``."""
    for unit in ("d", "h", "m", "s", "ms"):
        n = seconds / _UNITS[unit]
        if abs(n - round(n)) < 1e-9 and round(n) >= 1:
            return f"{round(n)}{unit}"
    return f"{seconds:g}s"


def parse_gc_policy(words: Sequence[str]) -> GcRule | None:
    """A GC policy from cbt's words (see the module docstring); ``never`` → None.

    A trailing ``force`` (cbt's replication override) is accepted and has no effect."""
    tokens = _TOKEN.findall(" ".join(words))
    if tokens and tokens[-1].lower() == "force":
        tokens.pop()
    if not tokens:
        raise InvalidArgument("missing GC policy: expected maxversions=N, maxage=D or never")
    if len(tokens) == 1 and tokens[0].lower() == "never":
        return None
    parser = _PolicyParser(tokens)
    rule = parser.expression()
    if parser.pos != len(tokens):
        raise InvalidArgument(f"bad GC policy: unexpected {tokens[parser.pos]!r}")
    return rule


class _PolicyParser:
    """Recursive descent over the policy tokens; ``pos`` is the next token."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expression(self) -> GcRule:
        rules = [self.term()]
        op: str | None = None
        while (tok := self._peek()) is not None and tok != ")":
            this = {"and": "and", "&&": "and", "or": "or", "||": "or"}.get(tok.lower())
            if this is None:
                raise InvalidArgument(f"bad GC policy: expected and/or, got {tok!r}")
            if op is not None and this != op:
                raise InvalidArgument(
                    "bad GC policy: mixing 'and' and 'or' needs parentheses, "
                    "e.g. (maxage=1d or maxversions=3) and maxversions=5"
                )
            op = this
            self.pos += 1
            rules.append(self.term())
        if len(rules) == 1:
            return rules[0]
        return IntersectionRule(rules=rules) if op == "and" else UnionRule(rules=rules)

    def term(self) -> GcRule:
        tok = self._peek()
        if tok is None:
            raise InvalidArgument("bad GC policy: it ends where a rule was expected")
        self.pos += 1
        if tok == "(":
            rule = self.expression()
            if self._peek() != ")":
                raise InvalidArgument("bad GC policy: missing ')'")
            self.pos += 1
            return rule
        key, _, value = tok.partition("=")
        if key.lower() == "maxversions":
            return MaxVersionsRule(max_versions=parse_count("maxversions", value))
        if key.lower() == "maxage":
            return MaxAgeRule(max_age_seconds=parse_duration(value))
        raise InvalidArgument(
            f"bad GC policy term {tok!r}: expected maxversions=N, maxage=D or never"
        )


def format_gc_rule(rule: GcRule | None) -> str:
    """cbt's rendering: ``versions() > 3``, ``age() > 10d``, ``(a || b)``, ``(a && b)``."""
    if rule is None:
        return ""
    if isinstance(rule, MaxVersionsRule):
        return f"versions() > {rule.max_versions}"
    if isinstance(rule, MaxAgeRule):
        return f"age() > {format_duration(rule.max_age_seconds)}"
    joiner = " || " if isinstance(rule, UnionRule) else " && "
    return "(" + joiner.join(format_gc_rule(r) for r in rule.rules) + ")"


def parse_families(spec: str) -> list[ColumnFamily]:
    """createtable's ``families=f1,f2:maxversions=2,f3:maxage=10d||maxversions=1``."""
    out: list[ColumnFamily] = []
    for item in spec.split(","):
        name, colon, policy = item.strip().partition(":")
        rule = parse_gc_policy([policy]) if colon else None
        out.append(family(name, rule))
    return out


#: Aggregate value types by the names ``createfamily T F:TYPE`` accepts (cbt's names too).
VALUE_TYPE_NAMES = {
    "sum": "sum",
    "min": "min",
    "max": "max",
    "hll": "hll",
    "intsum": "sum",
    "intmin": "min",
    "intmax": "max",
    "inthll": "hll",
}


def family_with_type(spec: str) -> ColumnFamily:
    """createfamily's ``F`` or ``F:TYPE`` (``sum``, ``min``, ``max``, ``hll``: an aggregate
    family, ``data.aggregates``)."""
    name, colon, type_name = spec.partition(":")
    if not colon:
        return family(name)
    value_type = VALUE_TYPE_NAMES.get(type_name.lower())
    if value_type is None:
        raise InvalidArgument(
            f"bad family {spec!r}: the value type after ':' must be one of sum, min, max, hll"
        )
    return family(name, value_type=value_type)


def parse_add_arg(arg: str, value_type: str | None) -> AddToCell:
    """addtocell's ``family:qualifier=value[@timestamp]``: an integer for sum, min and max
    families, a string (counted as its bytes) for hll."""
    column, eq, value = arg.partition("=")
    family_name, colon, qualifier = column.partition(":")
    if not eq or not colon or not family_name:
        raise InvalidArgument(
            f"bad addtocell arg {arg!r}: expected family:column=value[@timestamp]"
        )
    timestamp: int | None = None
    head, at, tail = value.rpartition("@")
    if at and _TIMESTAMP.fullmatch(tail):
        value, timestamp = head, int(tail)
    if value_type is None:
        raise InvalidArgument(
            f"column family {family_name!r} is not an aggregate family (create it with "
            f"createfamily T {family_name}:sum|min|max|hll)"
        )
    if value_type == "hll":
        return AddToCell(family_name, arg_bytes(qualifier), arg_bytes(value), timestamp)
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(
            f"bad addtocell arg {arg!r}: a {value_type} family adds integers, not {value!r}"
        ) from None
    return AddToCell(family_name, arg_bytes(qualifier), number, timestamp)


def family(name: str, rule: GcRule | None = None, *, value_type: str | None = None) -> ColumnFamily:
    """A ColumnFamily, with a bad name reported as InvalidArgument."""
    try:
        return ColumnFamily.model_validate(
            {"name": name, "gc_rule": rule, "value_type": value_type}
        )
    except ValueError as exc:
        raise InvalidArgument(
            f"column family name {name!r} must be 1-64 printable ASCII characters "
            "without spaces or ':'"
        ) from exc


def schema_lines(schema: TableSchema) -> list[str]:
    """``ls TABLE``: a header and one line per family with its GC policy, aligned."""
    rows = [("Family Name", "GC Policy"), ("-----------", "---------")]
    rows += [(n, format_gc_rule(f.gc_rule)) for n, f in sorted(schema.families.items())]
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{name:<{width}}{policy}" for name, policy in rows]
    if any(f.value_type for f in schema.families.values()):
        # A third column only for tables with aggregate families (the usual output is cbt's).
        types = ["Value Type", "----------"]
        types += [f.value_type or "bytes" for _, f in sorted(schema.families.items())]
        policy_width = max(len(line) for line in lines) + 2
        lines = [f"{line:<{policy_width}}{t}" for line, t in zip(lines, types, strict=True)]
    out = [line.rstrip() for line in lines]
    if schema.history == HISTORY_OFF:
        out.append("History: off (whatever the database's default)")
    elif schema.history is not None:
        # Only for tables with history (the usual output is cbt's).
        out.append(f"History: {format_duration(schema.history)}")
    return out


# -- reads -------------------------------------------------------------------------------------
def column_filter(spec: str) -> RowFilter:
    """cbt's ``columns=`` list as one filter (see the module docstring)."""
    parts: list[RowFilter] = []
    for item in spec.split(","):
        pieces = item.split(":")
        if not item or len(pieces) > 2:
            raise InvalidArgument(
                f"bad column {item!r}: expected family:qualifier, family: or qualifier"
            )
        if len(pieces) == 1 or not pieces[0]:
            parts.append(ColumnQualifierRegex(arg_bytes(pieces[-1])))
        elif not pieces[1]:
            parts.append(FamilyNameRegex(pieces[0]))
        else:
            parts.append(
                Chain([FamilyNameRegex(pieces[0]), ColumnQualifierRegex(arg_bytes(pieces[1]))])
            )
    return parts[0] if len(parts) == 1 else Interleave(parts)


def read_filter(opts: Mapping[str, str]) -> RowFilter | None:
    """The filter of ``lookup``/``read`` options: regex, columns, cells-per-column, chained."""
    chain: list[RowFilter] = []
    if "regex" in opts:
        chain.append(RowKeyRegex(arg_bytes(opts["regex"])))
    if "columns" in opts:
        chain.append(column_filter(opts["columns"]))
    if "cells-per-column" in opts:
        chain.append(CellsPerColumnLimit(parse_count("cells-per-column", opts["cells-per-column"])))
    if not chain:
        return None
    return chain[0] if len(chain) == 1 else Chain(chain)


# -- output ------------------------------------------------------------------------------------
def go_quote(data: bytes) -> str:
    """Go's ``%q`` of a byte string (cbt prints values so): printable UTF-8 as is, ``"`` and
    ``\\`` escaped, control characters as ``\\n``/``\\xNN``/``\\uNNNN``, bytes that are not
    UTF-8 as ``\\xNN``."""
    return '"' + "".join(_escape(ch) for ch in _chars(data)) + '"'


def _chars(data: bytes) -> str:
    # Bytes that are not UTF-8 decode to lone surrogates U+DC80..U+DCFF (surrogateescape).
    return data.decode("utf-8", "surrogateescape")


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    if ch in '"\\':
        return "\\" + ch
    if ch.isprintable():
        return ch
    if ch in _GO_ESCAPES:
        return _GO_ESCAPES[ch]
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def format_timestamp(micros: int) -> str:
    """cbt's ``2006/01/02-15:04:05.000000`` in local time; out-of-range values as integers."""
    try:
        base = datetime.datetime.fromtimestamp(micros // 1_000_000)
    except (OverflowError, OSError, ValueError):
        # The platform cannot represent it as a date; the number itself is still exact.
        return str(micros)
    when = base + datetime.timedelta(microseconds=micros % 1_000_000)
    return when.strftime("%Y/%m/%d-%H:%M:%S.%f")


def printable_key(key: bytes) -> str:
    """A row key or qualifier for display: printable UTF-8 as is, other bytes and control
    characters escaped as in :func:`go_quote` (backslashes and quotes are left alone)."""
    return "".join(_escape(ch) if ch not in '"\\' else ch for ch in _chars(key))


def _aggregate_text(value_type: str, value: bytes) -> str | None:
    """An aggregate cell's value as text (an integer; an hll's estimate), None if it is not
    a state of its type (a stripped value)."""
    if value_type == "hll":
        try:
            return f"{hll.estimate(value)} (hll estimate)"
        except ValueError:
            return None
    if len(value) != 8:
        return None
    return str(int.from_bytes(value, "big", signed=True))


def format_row(row: Row, value_types: Mapping[str, str | None] | None = None) -> list[str]:
    """One row as cbt prints it: a rule, the key, then per cell its column, timestamp and
    quoted value, then an empty line. Cells come in the order a read returns them (family, qualifier, newest
    first). Cells of aggregate families (``value_types``) print their number."""
    lines = [ROW_RULE, printable_key(row.key)]
    types = value_types or {}
    for c in row.cells:
        column = f"{c.family}:{printable_key(c.qualifier)}"
        lines.append(f"  {column:<40} @ {format_timestamp(c.timestamp)}")
        value_type = types.get(c.family)
        text = None if value_type is None else _aggregate_text(value_type, c.value)
        lines.append(f"    {go_quote(c.value) if text is None else text}")
    lines.append("")
    return lines
