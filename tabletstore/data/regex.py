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
* Memory and time: each compiled pattern may use at most :data:`MAX_MEM` bytes (its program
  takes part, the lazily built DFA states the rest). RE2's compiler runs holding the GIL for
  about a microsecond per program instruction, and its program may fill about a third of the
  budget before the compile fails, so the budget is also what bounds one compile: 256 KiB
  (a program of about 21,000 instructions, compiled or refused in well under 20 ms) instead
  of RE2's default 8 MiB (700,000 instructions, close to a second). Everyday patterns have
  programs of tens to hundreds of instructions and keep ample DFA room. A pattern whose
  program does not fit (``(x[a-z]{999}|...)`` with a few dozen branches) is refused; so is a
  repeat count above 1000 or nested repeats whose product exceeds 1000 (``a{1000}{1000}``).
  How much one filter may compile in all is bounded by :mod:`tabletstore.data.filters`.
* Compiled patterns are kept in a least-recently-used cache of :data:`CACHE_SIZE` (at most
  ``CACHE_SIZE * MAX_MEM`` bytes); :func:`cached` answers from it without compiling, so a
  caller can compile what is missing off its event loop. The cache is shared by threads.

Every pattern RE2 rejects is :class:`InvalidArgument` naming the pattern and RE2's reason.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol, cast

import re2

from tabletstore.errors import InvalidArgument

__all__ = ["CACHE_SIZE", "MAX_MEM", "Pattern", "cached", "compile_re2", "program_size"]

#: RE2's memory budget per compiled pattern, which also bounds the time of one compile.
MAX_MEM = 256 << 10
#: Compiled patterns kept for reuse; at most ``CACHE_SIZE * MAX_MEM`` bytes (32 MiB).
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


_cache: OrderedDict[bytes, Pattern] = OrderedDict()
_cache_lock = threading.Lock()


def _compile(pattern: bytes) -> Pattern:
    try:
        return cast(Pattern, re2.compile(pattern, _OPTIONS))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("latin-1")
        raise InvalidArgument(f"invalid RE2 regex {pattern!r}: {reason}") from None


def cached(pattern: bytes) -> Pattern | None:
    """``pattern`` compiled, if the cache holds it (marking it recently used); never compiles."""
    with _cache_lock:
        compiled = _cache.get(pattern)
        if compiled is not None:
            _cache.move_to_end(pattern)
        return compiled


def compile_re2(pattern: bytes) -> Pattern:
    """Compile RE2 ``pattern``; ``.fullmatch(data) is not None`` tests a key, name or value.

    Answers from the cache when it can. Raises InvalidArgument naming the pattern if it is not
    bytes or RE2 rejects it (refusals are not cached).
    """
    if not isinstance(pattern, bytes):
        raise InvalidArgument(f"regex must be bytes, got {type(pattern).__name__}")
    compiled = cached(pattern)
    if compiled is not None:
        return compiled
    compiled = _compile(pattern)  # outside the lock: other threads' cache hits never wait
    with _cache_lock:
        _cache[pattern] = compiled
        _cache.move_to_end(pattern)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def program_size(pattern: Pattern) -> int:
    """RE2's instruction count for ``pattern``: the per-byte cost of its worst-case match."""
    return int(pattern.programsize)
