"""RE2 → Python regex translation: RE2 semantics pinned by examples, and (when the google-re2
bindings are installed) a differential test against the real RE2 in Latin-1 mode."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.errors import InvalidArgument, Unimplemented
from tabletstore.regex import compile_re2, translate_re2


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


def test_unknown_unicode_script_is_unimplemented() -> None:
    with pytest.raises(Unimplemented):
        compile_re2(b"\\p{Klingon}")


def test_non_bytes_pattern_rejected() -> None:
    with pytest.raises(InvalidArgument):
        compile_re2("abc")  # type: ignore[arg-type]


def test_translation_is_cached_and_plain_for_simple_patterns() -> None:
    assert translate_re2(b"abc") == b"abc"
    assert compile_re2(b"abc") is compile_re2(b"abc")


@given(st.binary(max_size=20))
def test_quoted_bytes_match_themselves(data: bytes) -> None:
    # Any byte string, quoted with \Q...\E (or hex escapes), matches exactly itself.
    if b"\\E" not in data:
        assert full(b"\\Q" + data + b"\\E", data)
    escaped = b"".join(b"\\x%02x" % b for b in data)
    assert full(escaped, data)
    assert not full(escaped, data + b"\x00")


# -- differential test against the real RE2 --------------------------------------------------
_DIFF_PATTERNS = [
    *(p for p, _, _ in SEMANTICS),
    b"x(?m)$\n^y|z",
    b"(?s)a.b(?-s)c.d",
    b"\\d{2,3}",
    b"(?i)[a-c]+",
    b"[^\\n]",
    b"(ab)*c",
    b"a{0}",
    b"(?m:^a$)\n?",
    b"\\QA\\E+",
    b"\\p{Lo}",
    b"\\p{Sm}",
    b"\\p{Zs}",
    b"\\p{Cf}",
    b"[[:punct:]]",
    b"[[:graph:]]",
    b"[[:cntrl:]]",
    b"[[:xdigit:]]",
    b"[[:word:]]+",
    b"\\w+\\b",
    b"\\Ba",
    b"(?i)\xc9",
    b"[\\x00-\\x{7f}]",
    b"()*",
    b"$+",
]
_ALPHABET = [bytes([b]) for b in b"abcAB\nxy.\x00\xff\xe9\xc9{,3}12ed_-& \x0b"]


def _corpus() -> list[bytes]:
    rng = random.Random(1)
    strings = [b""] + [bytes([i]) for i in range(256)]
    strings += [b"".join(t) for t in itertools.product(_ALPHABET, repeat=2)]
    strings += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6))) for _ in range(500)]
    strings += [b"".join(rng.choices(_ALPHABET, k=rng.randrange(3, 7))) for _ in range(1500)]
    return strings


def test_differential_against_real_re2() -> None:
    re2 = pytest.importorskip("re2")
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.log_errors = False
    corpus = _corpus()
    for pattern in INVALID:
        with pytest.raises(Exception):  # noqa: B017 - RE2 rejects it too (any error type)
            re2.compile(pattern, options)
    for pattern in _DIFF_PATTERNS:
        oracle = re2.compile(pattern, options)
        ours = compile_re2(pattern)
        for s in corpus:
            assert (ours.fullmatch(s) is not None) == (oracle.fullmatch(s) is not None), (
                pattern,
                s,
            )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                b"a",
                b"b",
                b".",
                b"\\C",
                b"*",
                b"+",
                b"?",
                b"|",
                b"(",
                b")",
                b"[ab]",
                b"[^a]",
                b"{2}",
                b"{1,2}",
                b"$",
                b"^",
                b"(?i)",
                b"(?s)",
                b"\\n",
                b"\n",
                b"\\x00",
                b"\xff",
                b"\\d",
                b"\\s",
                b"{,2}",
                b"\\b",
                b"(?:",
            ]
        ),
        max_size=8,
    ),
    st.lists(st.sampled_from([b"a", b"b", b"A", b"\n", b"\x00", b"\xff", b"1", b" ", b"{"])),
)
def test_random_patterns_agree_with_real_re2(parts: list[bytes], chars: list[bytes]) -> None:
    re2 = pytest.importorskip("re2")
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.log_errors = False
    pattern, data = b"".join(parts), b"".join(chars)
    try:
        oracle = re2.compile(pattern, options)
    except Exception:
        with pytest.raises(InvalidArgument):
            compile_re2(pattern)
        return
    assert (compile_re2(pattern).fullmatch(data) is not None) == (
        oracle.fullmatch(data) is not None
    ), (pattern, data)
