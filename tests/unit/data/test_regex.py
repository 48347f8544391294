"""RE2 regular expressions over raw bytes: Bigtable's semantics pinned by example, the errors
RE2 raises as InvalidArgument, and RE2's guarantees (no backtracking, a memory budget)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletstore.data.regex import compile_re2, program_size
from tabletstore.errors import InvalidArgument


def full(pattern: bytes, data: bytes) -> bool:
    return compile_re2(pattern).fullmatch(data) is not None


# -- semantics pinned by example -------------------------------------------------------------
SEMANTICS = [
    (b"abc", b"abc", True),
    (b"abc", b"abcd", False),  # full match, not search
    (b"b", b"abc", False),
    (b"a|ab", b"ab", True),  # full match backtracks into the second alternative
    (b".", b"\n", False),  # . does not match newline
    (b"(?s).", b"\n", True),
    (b"\\C", b"\n", True),  # \C matches any byte
    (b"\\C*", b"\x00\xff\n", True),
    (b"\\x00\\xff", b"\x00\xff", True),
    (b"\x00\xff", b"\x00\xff", True),  # raw bytes in the pattern are Latin-1 characters
    (b"[\xe0-\xff]+", b"\xe9\xff", True),
    (b"a$", b"a\n", False),  # $ is end of text, not "before a final newline"
    (b"a$\n", b"a\n", False),
    (b"(?m)a$\n", b"a\n", True),
    (b"a\\z", b"a", True),
    (b"\\0", b"\x00", True),  # octal, not a back-reference
    (b"\\12", b"\n", True),
    (b"\\0377", b"\x1f7", True),  # at most three octal digits
    (b"\\377", b"\xff", True),
    (b"\\x{e9}", b"\xe9", True),
    (b"a{,3}", b"a{,3}", True),  # {,n} is a literal in RE2
    (b"a{,3}", b"aa", False),
    (b"a{1,}", b"aaaa", True),
    (b"\\Qx.y\\E", b"x.y", True),
    (b"\\Qx.y\\E", b"xzy", False),
    (b"\\Qa*", b"a*", True),  # \Q without \E quotes to the end
    (b"(?i)ab", b"AB", True),
    (b"a(?i)b|ab", b"AB", True),  # (?i) applies to the later alternatives too
    (b"a(?i)b|ab", b"Ab", True),
    (b"(a|b(?i)c|d)e", b"De", True),
    (b"(a|b(?i)c|d)e", b"dE", False),
    (b"(?i)(?-i:a)b", b"aB", True),
    (b"(?i)(?-i:a)b", b"AB", False),
    (b"(?U)a+", b"aaa", True),
    (b"[[:upper:]]+", b"AZ", True),
    (b"[[:^alpha:]]", b"a", False),
    (b"[[:^alpha:]]", b"\xe9", True),
    (b"\\s", b"\x0b", False),  # Perl \s has no \v
    (b"[[:space:]]", b"\x0b", True),
    (b"\\pL", b"\xe9", True),  # Unicode classes over the Latin-1 code points
    (b"\\PL", b"\xe9", False),
    (b"\\p{^L}", b"1", True),
    (b"\\p{Greek}", b"a", False),
    (b"\\p{Latin}", b"\xe9", True),
    (b"^*a", b"a", True),  # a repeated assertion is legal
    (b"(?P<n>a)(?P<n>b)", b"ab", True),  # duplicate names are fine in RE2
    (b"(?<n>a)", b"a", True),
    (b"[]a]", b"]", True),
    (b"[^]a]", b"\n", True),
    (b"[a-]", b"-", True),
    (b"[a&&b]", b"&", True),  # no Python set operations
    (b"[+--]", b"-", True),  # a range ending in "-"
    (b"\\_", b"_", True),
    (b"(?)", b"", True),
    (b"a|", b"", True),
]


@pytest.mark.parametrize(("pattern", "data", "expected"), SEMANTICS)
def test_re2_semantics(pattern: bytes, data: bytes, expected: bool) -> None:
    assert full(pattern, data) is expected


INVALID = [
    b"(",
    b")",
    b"[a",
    b"a**",
    b"a*+",  # Python's possessive quantifier
    b"a++",
    b"a{2}{3}",
    b"*",
    b"a|*",
    b"(?=a)",  # lookarounds
    b"(?!a)",
    b"(?<=a)",
    b"(?<!a)",
    b"(?>a)",  # atomic group
    b"(a)\\1",  # back-references
    b"(?P<n>a)(?P=n)",
    b"(?(1)a|b)",  # conditional
    b"(?#comment)",
    b"(?x)a",  # flags RE2 does not have
    b"(?a)a",
    b"(?L)a",
    b"(?i-)a",
    b"(?P<>a)",
    b"\\Z",
    b"\\G",
    b"\\e",
    b"\\y",
    b"\\8",
    b"\\1",
    b"\\E",
    b"\\x0",
    b"\\x{100}",  # above Latin-1
    b"\\400",
    b"[\\C]",
    b"[z-a]",
    b"[a--]",
    b"[a-\\d]",
    b"[[:foo:]]",
    b"a{1001}",
    b"a{2,1}",
    b"\\",
]


@pytest.mark.parametrize("pattern", INVALID)
def test_invalid_patterns_name_the_pattern(pattern: bytes) -> None:
    with pytest.raises(InvalidArgument) as info:
        compile_re2(pattern)
    assert repr(pattern) in str(info.value)


def test_non_bytes_pattern_rejected() -> None:
    with pytest.raises(InvalidArgument):
        compile_re2("abc")  # type: ignore[arg-type]


@given(st.binary(max_size=20))
def test_quoted_bytes_match_themselves(data: bytes) -> None:
    # Any byte string, quoted with \Q...\E (or hex escapes), matches exactly itself.
    if b"\\E" not in data:
        assert full(b"\\Q" + data + b"\\E", data)
    escaped = b"".join(b"\\x%02x" % b for b in data)
    assert full(escaped, data)
    assert not full(escaped, data + b"\x00")


# -- what RE2 guarantees that a backtracking engine does not --------------------------------
HOSTILE = [
    # (pattern, a text it does not fully match, a text it does)
    (b"(a+)+$", b"a" * 31 + b"b", b"a" * 31),
    (b"(a*)*b", b"a" * 40, b"a" * 40 + b"b"),
    (b"(a|aa)+", b"a" * 60 + b"!", b"a" * 60),
    (b"(.*a){20}", b"a" * 19 + b"b" * 30, b"a" * 20),
]


@pytest.mark.parametrize(("pattern", "miss", "hit"), HOSTILE)
def test_catastrophic_backtracking_patterns_answer(pattern: bytes, miss: bytes, hit: bytes) -> None:
    # Python's re takes hours or more on each miss (exponential backtracking); RE2 is linear
    # in the text, so the right answer simply comes back.
    assert not full(pattern, miss)
    assert full(pattern, hit)


def test_unknown_unicode_class_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="Klingon"):
        compile_re2(b"\\p{Klingon}")


@pytest.mark.parametrize(
    "pattern",
    [
        b"a{1000}{1000}",  # nested repeats: RE2 caps the product at 1000
        b"(a{1000}){1000}",
        b"((a{100}){100}){100}",
        b"|".join(b"x%d\\C{1000}" % i for i in range(1000)),  # program above the memory budget
        b"a" * 2_000_000,
    ],
)
def test_patterns_beyond_the_memory_budget_are_invalid(pattern: bytes) -> None:
    with pytest.raises(InvalidArgument) as info:
        compile_re2(pattern)
    assert "invalid RE2 regex" in str(info.value)


def test_program_size_grows_with_the_pattern() -> None:
    assert program_size(compile_re2(b"abc")) < 10
    assert program_size(compile_re2(b"\\C{1000}")) > 1000


def test_compiled_patterns_are_cached() -> None:
    assert compile_re2(b"abc") is compile_re2(b"abc")
