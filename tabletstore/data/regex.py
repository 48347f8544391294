"""RE2 regular expressions over raw bytes, as Bigtable's regex filters evaluate them (§3).

Cloud Bigtable's regex filters (row key, family, qualifier, value) use RE2 syntax in raw-byte mode
(``RE2::Latin1``) and evaluate as *full* matches. This module owns compiling such a pattern with
RE2 itself (the ``google-re2`` bindings), so the syntax, the semantics and the errors are RE2's
and nothing is translated:

* Every byte of the pattern and of the matched text is one Latin-1 character; ``.`` does not
  match ``\\n`` (unless ``(?s)``); ``\\C`` matches any byte; ``$`` is end of text outside
  ``(?m)``; Unicode classes (``\\pL``, ``\\p{Greek}``) match their Latin-1 code points.
* A match is anchored at both ends (``fullmatch``) over the whole bytes value.
* RE2 never backtracks: a match costs O(len(text) x program size) in the worst case (its DFA,
  or its NFA when the DFA exceeds its memory budget), never exponential time. The worst case is
  still large for big programs on big values, which is why the read path weighs each row's
  regex work (:func:`program_size` times the bytes matched, summed by
  :func:`tabletstore.data.filters.regex_cost`) before evaluating it on the event loop
  (:mod:`tabletstore.engine.read_path`).
* Memory: each compiled pattern may use at most :data:`MAX_MEM` bytes (RE2's default budget;
  its program takes part, the lazily built DFA states the rest). A pattern whose program does
  not fit (``(x\\C{1000}|...)`` with thousands of branches) is refused; so is a repeat count
  above 1000 or nested repeats whose product exceeds 1000 (``a{1000}{1000}``). Compiled
  patterns are cached (:data:`CACHE_SIZE` of them), bounding what the cache can hold.

Every pattern RE2 rejects is :class:`InvalidArgument` naming the pattern and RE2's reason.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol, cast

import re2

from tabletstore.errors import InvalidArgument

__all__ = ["CACHE_SIZE", "MAX_MEM", "Pattern", "compile_re2", "program_size"]

#: RE2's memory budget per compiled pattern (its default, which Cloud Bigtable's servers use).
MAX_MEM = 8 << 20
#: Compiled patterns kept for reuse; at most ``CACHE_SIZE * MAX_MEM`` bytes in the worst case.
CACHE_SIZE = 128


class Pattern(Protocol):
    """A compiled RE2 pattern: ``fullmatch(data)`` is not None when all of ``data`` matches."""

    @property
    def programsize(self) -> int: ...

    def fullmatch(self, text: bytes) -> object | None: ...


def _options() -> re2.Options:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.max_mem = MAX_MEM
    # Only whether a full match exists matters: without capture groups RE2 answers from its DFA
    # alone, about twice as fast as when it must also report sub-match positions.
    options.never_capture = True
    # Errors are raised to the caller as InvalidArgument; RE2 must not also print them.
    options.log_errors = False
    return options


_OPTIONS = _options()


@lru_cache(maxsize=CACHE_SIZE)
def _compile(pattern: bytes) -> Pattern:
    try:
        return cast(Pattern, re2.compile(pattern, _OPTIONS))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("latin-1")
        raise InvalidArgument(f"invalid RE2 regex {pattern!r}: {reason}") from None


def compile_re2(pattern: bytes) -> Pattern:
    """Compile RE2 ``pattern``; ``.fullmatch(data) is not None`` tests a key, name or value.

    Raises InvalidArgument naming the pattern if it is not bytes or RE2 rejects it.
    """
    if not isinstance(pattern, bytes):
        raise InvalidArgument(f"regex must be bytes, got {type(pattern).__name__}")
    return _compile(pattern)


def program_size(pattern: Pattern) -> int:
    """RE2's instruction count for ``pattern``: the per-byte cost of its worst-case match."""
    return int(pattern.programsize)
