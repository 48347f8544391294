"""RE2 regular expressions over raw bytes, as Bigtable's regex filters evaluate them (§3).

Cloud Bigtable's regex filters (row key, family, qualifier, value) use RE2 syntax in raw-byte mode
(``RE2::Latin1``) and evaluate as *full* matches. This module owns the translation of such a
pattern into a Python :mod:`re` pattern over ``bytes`` whose :meth:`re.Pattern.fullmatch` accepts
exactly the strings RE2 would, and the validation that rejects what RE2 rejects. It is the only
place that knows the two dialects differ.

What the translator does (each point checked against the real RE2 in Latin-1 mode through the
``google-re2`` bindings; ``tests/unit/test_regex.py`` keeps a differential test):

* Every byte of the pattern is one Latin-1 character; ``.`` does not match ``\\n`` (unless
  ``(?s)``); ``\\C`` matches any byte.
* ``$`` outside ``(?m)`` means end of text (RE2), not "before a final newline" (Python): it becomes
  ``\\Z``. ``\\z`` becomes ``\\Z``; RE2's invalid ``\\Z`` is rejected.
* Octal escapes (``\\0``, ``\\12``, ``\\377``) become ``\\xHH`` (Python would read ``\\12`` as a
  back-reference); ``\\1`` alone and ``\\8`` are errors, as in RE2. ``\\x{HH}`` is accepted;
  code points above 0xFF are errors in Latin-1 mode.
* ``\\Q...\\E`` quotes literally; ``\\s`` is Perl's ``[\\t\\n\\f\\r ]`` (no ``\\v``); POSIX
  classes ``[[:alpha:]]``/``[[:^alpha:]]`` and Unicode classes ``\\pL``, ``\\p{Lu}``, ``\\PN``,
  ``\\p{^L}`` are expanded to explicit byte sets (the Latin-1 code points of that class).
  Character classes are always re-emitted as ``\\xHH`` ranges, so no Python-only class syntax
  (nested sets, ``&&``, ``--``) can leak through.
* ``{,n}`` and other malformed braces are literals (RE2) rather than ``{0,n}`` (Python); repeat
  counts above 1000, inverted counts, nested repetition (``a**``, ``a*+`` -- Python's possessive
  quantifier) and repetition without an argument are errors. A repeated empty-width assertion
  (``^*``, ``\\b+``), legal in RE2, is wrapped in a group so Python accepts it.
* Flags ``i``, ``m``, ``s``, ``U`` (with ``-`` to clear) in ``(?flags)`` and ``(?flags:...)``.
  ``(?flags)`` in the middle of a group applies to the rest of that group, across later ``|``
  alternatives, as in RE2. ``U`` (ungreedy) changes only sub-match positions, never whether a
  full match exists, so it is accepted and dropped.
* Capture-group names (``(?P<n>...)``, ``(?<n>...)``) are dropped: only the match matters and
  RE2 allows names Python does not (duplicates, leading digits).
* Rejected with :class:`InvalidArgument` naming the pattern: lookarounds, atomic groups,
  back-references (``\\1``, ``(?P=n)``), conditionals, comments ``(?#...)``, flags other than
  ``imsU`` (``x``, ``a``, ``L``, ``u``), and every other RE2 syntax error.

Known incompatibilities (documented, not silently different):

* Unicode *script* classes are supported only for ``Latin``, ``Common`` and a list of scripts
  with no Latin-1 code points (which therefore match nothing); other script names raise
  :class:`Unimplemented`.
* Python's ``re`` is a backtracking engine: a pathological pattern such as ``(a*)*b`` over a long
  value can take exponential time, where RE2 is linear. Callers that take patterns from
  untrusted users should bound the size of what they match.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

from tabletstore.errors import InvalidArgument, Unimplemented

__all__ = ["MAX_REPEAT", "compile_re2", "translate_re2"]

#: RE2's largest explicit repeat count (``a{1001}`` is an error).
MAX_REPEAT = 1000

_ESCAPE_BYTES = {ord("a"): 7, ord("f"): 12, ord("t"): 9, ord("n"): 10, ord("r"): 13, ord("v"): 11}
_ALL = frozenset(range(256))
_PERL_SPACE = frozenset(b"\t\n\f\r ")
_DIGIT = frozenset(range(ord("0"), ord("9") + 1))
_UPPER = frozenset(range(ord("A"), ord("Z") + 1))
_LOWER = frozenset(range(ord("a"), ord("z") + 1))
_WORD = _DIGIT | _UPPER | _LOWER | {ord("_")}
_PUNCT = frozenset(b for b in range(33, 127) if b not in _WORD or b == ord("_"))
_POSIX: dict[bytes, frozenset[int]] = {
    b"alnum": _DIGIT | _UPPER | _LOWER,
    b"alpha": _UPPER | _LOWER,
    b"ascii": frozenset(range(128)),
    b"blank": frozenset(b"\t "),
    b"cntrl": frozenset(range(32)) | {127},
    b"digit": _DIGIT,
    b"graph": frozenset(range(33, 127)),
    b"lower": _LOWER,
    b"print": frozenset(range(32, 127)),
    b"punct": _PUNCT,
    b"space": frozenset(b"\t\n\v\f\r "),
    b"upper": _UPPER,
    b"word": _WORD,
    b"xdigit": _DIGIT | frozenset(b"abcdefABCDEF"),
}
_PERL: dict[int, tuple[frozenset[int], bool]] = {
    ord("d"): (_DIGIT, False),
    ord("D"): (_DIGIT, True),
    ord("w"): (_WORD, False),
    ord("W"): (_WORD, True),
    ord("s"): (_PERL_SPACE, False),
    ord("S"): (_PERL_SPACE, True),
}
_CATEGORIES = frozenset(
    "C Cc Cf Co Cs L Ll Lm Lo Lt Lu M Mc Me Mn N Nd Nl No P Pc Pd Pe Pf Pi Po Ps "
    "S Sc Sk Sm So Z Zl Zp Zs".split()
)
# Scripts with no code point in U+0000..U+00FF: valid RE2 names that match no Latin-1 byte.
_FOREIGN_SCRIPTS = frozenset(
    "Arabic Armenian Bengali Cherokee Cyrillic Devanagari Ethiopic Georgian Greek Gujarati "
    "Gurmukhi Han Hangul Hebrew Hiragana Kannada Katakana Khmer Lao Malayalam Mongolian "
    "Myanmar Oriya Sinhala Tamil Telugu Thaana Thai Tibetan Inherited".split()
)
_LATIN_LETTERS = frozenset(
    b for b in range(256) if unicodedata.category(chr(b)).startswith("L") and b not in (0xB5,)
)


def _unicode_class(name: str) -> frozenset[int]:
    """The Latin-1 bytes in Unicode class ``name`` (a general category or a script)."""
    if name == "Any":
        return _ALL
    if name in _CATEGORIES:
        return frozenset(b for b in range(256) if unicodedata.category(chr(b)).startswith(name))
    if name == "Latin":
        return _LATIN_LETTERS
    if name == "Common":
        return _ALL - _LATIN_LETTERS
    if name in _FOREIGN_SCRIPTS:
        return frozenset()
    raise Unimplemented(f"Unicode class \\p{{{name}}} is not supported")


class _Error(Exception):
    """A syntax error inside the translator; becomes InvalidArgument naming the pattern."""


def _literal(b: int) -> bytes:
    """Python-regex text matching exactly the byte ``b``."""
    if 48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122:
        return bytes([b])
    return b"\\x%02x" % b


def _class_text(members: frozenset[int] | set[int], negate: bool) -> bytes:
    """A Python character class for a byte set, written only with ``\\xHH`` ranges."""
    if not members:
        # An empty class matches nothing; a negated empty one matches any byte.
        return b"[\\x00-\\xff]" if negate else b"[^\\x00-\\xff]"
    parts: list[bytes] = []
    run_start = prev = -2
    for b in sorted(members):
        if b != prev + 1:
            if run_start >= 0:
                parts.append(_range_text(run_start, prev))
            run_start = b
        prev = b
    parts.append(_range_text(run_start, prev))
    return b"[" + (b"^" if negate else b"") + b"".join(parts) + b"]"


def _range_text(lo: int, hi: int) -> bytes:
    return b"\\x%02x" % lo if lo == hi else b"\\x%02x-\\x%02x" % (lo, hi)


@dataclass
class _Frame:
    """One open group. ``pending`` holds the openers of ``(?flags)`` scopes still open in it;
    ``deferred`` those not written yet: a ``(?flags)`` is transparent to a quantifier right
    after it (RE2 reads ``a(?i)*`` as ``a*``), so its opener is written only before the next
    atom, group or ``|``."""

    multiline: bool
    out_index: int
    pending: list[bytes] = field(default_factory=list)
    deferred: list[bytes] = field(default_factory=list)


class _Translator:
    """Single pass over an RE2 pattern, writing the equivalent Python pattern into ``out``."""

    def __init__(self, pattern: bytes) -> None:
        self.p = pattern
        self.i = 0
        self.out: list[bytes] = []
        self.frames = [_Frame(multiline=False, out_index=0)]
        # Index in ``out`` of the last atom a quantifier may repeat (None: nothing to repeat).
        self.atom: int | None = None
        self.atom_is_assertion = False
        self.after_quantifier = False
        # A ``(?flags)`` came after the last quantifier: RE2 then allows another one.
        self.flags_since_quantifier = False

    def translate(self) -> bytes:
        while self.i < len(self.p):
            self._step()
        if len(self.frames) > 1:
            raise _Error("missing closing )")
        self.out.append(b")" * len(self.frames[0].pending))
        return b"".join(self.out)

    # -- helpers -----------------------------------------------------------------------------
    def _peek(self, offset: int = 0) -> int | None:
        j = self.i + offset
        return self.p[j] if j < len(self.p) else None

    def _flush_flags(self) -> None:
        frame = self.frames[-1]
        self.out.extend(frame.deferred)
        frame.pending.extend(frame.deferred)
        frame.deferred.clear()

    def _emit_atom(self, text: bytes, *, assertion: bool = False) -> None:
        self._flush_flags()
        self.atom = len(self.out)
        self.atom_is_assertion = assertion
        self.after_quantifier = False
        self.out.append(text)

    # -- main dispatch -----------------------------------------------------------------------
    def _step(self) -> None:
        c = self.p[self.i]
        self.i += 1
        if c == ord("\\"):
            self._escape()
        elif c == ord("["):
            self._emit_atom(self._char_class())
        elif c == ord("("):
            self._open_group()
        elif c == ord(")"):
            self._close_group()
        elif c == ord("|"):
            self._alternate()
        elif c in b"*+?":
            self._quantifier(bytes([c]))
        elif c == ord("{") and (counts := self._repeat_counts()) is not None:
            self._quantifier(counts)
        elif c == ord("."):
            self._emit_atom(b".")
        elif c == ord("^"):
            self._emit_atom(b"^", assertion=True)
        elif c == ord("$"):
            self._emit_atom(b"$" if self.frames[-1].multiline else b"\\Z", assertion=True)
        else:
            self._emit_atom(_literal(c))

    def _quantifier(self, text: bytes) -> None:
        if self.atom is None:
            raise _Error(f"missing argument to repetition operator: {text.decode('latin-1')}")
        if self.after_quantifier and not self.flags_since_quantifier:
            raise _Error(f"bad repetition operator: {text.decode('latin-1')}")
        if self.atom_is_assertion or self.after_quantifier:
            self.out.insert(self.atom, b"(?:")
            self.out.append(b")")
        self.out.append(text)
        if self._peek() == ord("?"):
            self.i += 1
            self.out.append(b"?")
        self.after_quantifier = True
        self.flags_since_quantifier = False

    def _repeat_counts(self) -> bytes | None:
        """Parse ``{n}``, ``{n,}``, ``{n,m}`` after ``{``; None means ``{`` is a literal."""
        m = re.compile(rb"(\d+)(,(\d*))?\}").match(self.p, self.i)
        if m is None:
            return None
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
        if lo > MAX_REPEAT or (hi is not None and (hi > MAX_REPEAT or hi < lo)):
            raise _Error(f"bad repetition size: {{{m.group(0)[:-1].decode()}}}")
        self.i = m.end()
        return b"{" + m.group(0)

    # -- groups and flags ----------------------------------------------------------------------
    def _open_group(self) -> None:
        frame = self.frames[-1]
        if self._peek() != ord("?"):
            self._push(b"(", frame.multiline)
            return
        self.i += 1
        rest = self.p[self.i :]
        if rest.startswith(b"P<") or (rest.startswith(b"<") and rest[1:2] not in (b"=", b"!")):
            start = self.i + (2 if rest.startswith(b"P<") else 1)
            end = self.p.find(b">", start)
            name = self.p[start:end] if end >= 0 else b""
            if end < 0 or not name or not re.fullmatch(rb"\w+", name):
                raise _Error("invalid named capture group")
            self.i = end + 1
            self._push(b"(", frame.multiline)
            return
        m = re.compile(rb"([imsU]*)(?:-([imsU]+))?([:)])").match(self.p, self.i)
        if m is None:
            raise _Error(f"invalid or unsupported Perl syntax: (?{rest[:2].decode('latin-1')}")
        self.i = m.end()
        on, off = set(m.group(1).decode()), set((m.group(2) or b"").decode())
        on -= off
        multiline = (frame.multiline or "m" in on) and "m" not in off
        opener = self._flag_opener(on, off)
        if m.group(3) == b":":
            self._push(opener, multiline)
            return
        # ``(?flags)``: scope the flags over the rest of the enclosing group.
        if opener != b"(?:":
            frame.deferred.append(opener)
        frame.multiline = multiline
        self.flags_since_quantifier = True

    @staticmethod
    def _flag_opener(on: set[str], off: set[str]) -> bytes:
        on_s = "".join(sorted(on - {"U"}))
        off_s = "".join(sorted(off - {"U"}))
        return f"(?{on_s}{'-' + off_s if off_s else ''}:".encode()

    def _push(self, opener: bytes, multiline: bool) -> None:
        self._flush_flags()
        self.frames.append(_Frame(multiline=multiline, out_index=len(self.out)))
        self.out.append(opener)
        self.atom = None
        self.after_quantifier = False

    def _close_group(self) -> None:
        if len(self.frames) == 1:
            raise _Error("unexpected )")
        frame = self.frames.pop()
        self.out.append(b")" * len(frame.pending) + b")")
        self.atom = frame.out_index
        self.atom_is_assertion = False
        self.after_quantifier = False

    def _alternate(self) -> None:
        self._flush_flags()
        frame = self.frames[-1]
        self.out.append(b")" * len(frame.pending) + b"|" + b"".join(frame.pending))
        self.atom = None
        self.after_quantifier = False

    # -- escapes -------------------------------------------------------------------------------
    def _escape(self) -> None:
        c = self._peek()
        if c is None:
            raise _Error("trailing \\")
        self.i += 1
        if c == ord("Q"):
            end = self.p.find(b"\\E", self.i)
            text = self.p[self.i :] if end < 0 else self.p[self.i : end]
            self.i = len(self.p) if end < 0 else end + 2
            for b in text:
                self._emit_atom(_literal(b))
        elif c == ord("C"):
            self._emit_atom(b"[\\x00-\\xff]")
        elif c in b"AzbB":
            self._emit_atom(b"\\Z" if c == ord("z") else b"\\" + bytes([c]), assertion=True)
        elif c in _PERL:
            members, negate = _PERL[c]
            self._emit_atom(_class_text(members, negate))
        elif c in b"pP":
            self._emit_atom(_class_text(self._unicode_escape(c), False))
        else:
            self.i -= 1
            self._emit_atom(_literal(self._byte_escape()))

    def _byte_escape(self) -> int:
        """Parse an escape (after ``\\``) that denotes a single byte; return the byte."""
        c = self.p[self.i]
        self.i += 1
        if c == ord("x"):
            m = re.compile(rb"\{([0-9A-Fa-f]+)\}|([0-9A-Fa-f]{2})").match(self.p, self.i)
            if m is None:
                raise _Error("invalid escape sequence: \\x")
            self.i = m.end()
            value = int(m.group(1) or m.group(2), 16)
            if value > 0xFF:
                raise _Error("invalid escape sequence: code point above \\xff in Latin-1 mode")
            return value
        if ord("0") <= c <= ord("7"):
            # RE2: \0 starts an octal escape; \1..\7 only when another octal digit follows
            # (a lone \1 would be a back-reference, which RE2 does not support).
            m = re.compile(rb"[0-7]{0,2}").match(self.p, self.i)
            assert m is not None
            digits = bytes([c]) + m.group(0)
            if c != ord("0") and len(digits) == 1:
                raise _Error(f"invalid escape sequence: \\{chr(c)}")
            self.i = m.end()
            if int(digits, 8) > 0xFF:
                raise _Error(f"invalid escape sequence: \\{digits.decode()}")
            return int(digits, 8)
        if c in _ESCAPE_BYTES:
            return _ESCAPE_BYTES[c]
        if (c < 0x80 and c not in _WORD) or c == ord("_"):
            return c
        raise _Error(f"invalid escape sequence: \\{chr(c)}")

    def _unicode_escape(self, c: int) -> frozenset[int]:
        """Parse the class after ``\\p``/``\\P``; return its member bytes (negation applied)."""
        negate = c == ord("P")
        nxt = self._peek()
        if nxt is None:
            raise _Error("invalid character class range: \\p")
        if nxt == ord("{"):
            end = self.p.find(b"}", self.i)
            if end < 0:
                raise _Error("invalid character class range: missing }")
            name = self.p[self.i + 1 : end].decode("latin-1")
            self.i = end + 1
            if name.startswith("^"):
                negate, name = not negate, name[1:]
        else:
            name = chr(nxt)
            self.i += 1
        members = _unicode_class(name)
        return _ALL - members if negate else members

    # -- character classes ---------------------------------------------------------------------
    def _char_class(self) -> bytes:
        negate = self._peek() == ord("^")
        if negate:
            self.i += 1
        members: set[int] = set()
        first = True
        while True:
            c = self._peek()
            if c is None:
                raise _Error("missing closing ]")
            if c == ord("]") and not first:
                self.i += 1
                return _class_text(members, negate)
            first = False
            if c == ord("[") and self._peek(1) == ord(":") and self._posix_class(members):
                continue
            lo = self._class_member(members)
            if lo is None:
                continue
            if self._peek() == ord("-") and self._peek(1) not in (ord("]"), None):
                self.i += 1
                hi = self._class_member(members)
                if hi is None:
                    raise _Error("invalid character class range")
                if hi < lo:
                    raise _Error(f"invalid character class range: {chr(lo)}-{chr(hi)}")
                members.update(range(lo, hi + 1))
            else:
                members.add(lo)

    def _posix_class(self, members: set[int]) -> bool:
        """Parse ``[:name:]`` / ``[:^name:]`` at ``self.i``; False if it is not one."""
        end = self.p.find(b":]", self.i + 2)
        if end < 0:
            return False
        name = self.p[self.i + 2 : end]
        negate = name.startswith(b"^")
        cls = _POSIX.get(name[1:] if negate else name)
        if cls is None:
            raise _Error(f"invalid character class range: [:{name.decode('latin-1')}:]")
        members.update(_ALL - cls if negate else cls)
        self.i = end + 2
        return True

    def _class_member(self, members: set[int]) -> int | None:
        """One class member: returns its byte, or adds a whole set and returns None."""
        c = self.p[self.i]
        self.i += 1
        if c != ord("\\"):
            return c
        e = self._peek()
        if e is None:
            raise _Error("missing closing ]")
        if e in _PERL:
            self.i += 1
            cls, negate = _PERL[e]
            members.update(_ALL - cls if negate else cls)
            return None
        if e in b"pP":
            self.i += 1
            members.update(self._unicode_escape(e))
            return None
        return self._byte_escape()


@lru_cache(maxsize=4096)
def translate_re2(pattern: bytes) -> bytes:
    """The Python ``re`` pattern equivalent to RE2 ``pattern`` in Latin-1 full-match mode.

    Raises InvalidArgument naming the pattern if RE2 would reject it (or if it uses syntax
    this translator does not support; see the module docstring).
    """
    try:
        return _Translator(pattern).translate()
    except _Error as exc:
        raise InvalidArgument(f"invalid RE2 regex {pattern!r}: {exc}") from None
    except Unimplemented as exc:
        raise Unimplemented(f"unsupported RE2 regex {pattern!r}: {exc}") from None


@lru_cache(maxsize=4096)
def compile_re2(pattern: bytes) -> re.Pattern[bytes]:
    """Compile RE2 ``pattern``; use ``.fullmatch(data)`` to test a key, qualifier or value."""
    if not isinstance(pattern, bytes):
        raise InvalidArgument(f"regex must be bytes, got {type(pattern).__name__}")
    translated = translate_re2(pattern)
    try:
        return re.compile(translated)
    except re.error as exc:  # the translator let through something Python rejects
        raise InvalidArgument(f"invalid RE2 regex {pattern!r}: {exc}") from None
