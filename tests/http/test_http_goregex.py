"""Go (RE2) patterns under Python's re: where the two differ, Go's meaning wins; where they agree,
the translation changes nothing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.http.goregex import GoRegexError, compile_go


@pytest.mark.parametrize(("pattern", "text", "matches"), [
    ("a$\n", "a\n", False),  # Go's $ is the end of the text, not "before a final newline"
    ("(?m)a$\nb", "a\nb", True),
    ("\\d+", "12", True),
    ("\\d+", "\u0663", False),  # Arabic-Indic three: a digit to Python, not to Go
    ("\\w+", "é", False),
    ("[\\w.]+", "a.b_1", True),
    ("\\s", "\v", False),  # Go's \s is [\t\n\f\r ]
    ("a.b", "a\nb", True),  # Prometheus wraps in (?s:)
    ("x(?i)ab", "xAB", True),
    ("(?:x(?i)a)b", "xAB", False),  # the flag ends with its group
    ("(?i:A)b", "aB", False),
    ("(?<n>a)\\z", "a", True),
    ("\\Qa.b\\E", "a.b", True),
    ("\\Qa.b\\E", "axb", False),
    ("\\x{41}\\x42\\101", "ABA", True),
    ("[[:alpha:]]+[[:digit:]]", "ab1", True),
    ("[]a]+", "]a", True),
    ("[^]a]", "b", True),
    ("[a-]+", "a-", True),
    ("a{2,3}", "aaa", True),
    ("a{,3}", "a{,3}", True),  # not a repetition in Go: literal
    ("a\\b", "a", True),
    ("a*?b", "aab", True),
    ("[[&~|]+", "[&~|", True),
])
def test_go_meaning(pattern: str, text: str, matches: bool) -> None:
    assert (compile_go(pattern).fullmatch(text) is not None) is matches


@pytest.mark.parametrize(("pattern", "message"), [
    ("(?=a)", "look-around"), ("(?<!a)b", "look-around"), ("(?>a)", "atomic"), ("(?#c)", "comments"),
    ("(a)\\1", "back-references"), ("(?P=n)", "back-references"), ("a*+", "nested repetition"),
    ("a**", "nested repetition"), ("a{2}{3}", "nested repetition"), ("a{1001}", "limit is 1000"),
    ("\\p{Greek}", "Unicode classes"), ("(?U)a", "ungreedy"), ("(?x)a", "invalid flag"), ("\\C", "\\C"),
    ("[\\D]", "negated class"), ("[[:^alpha:]]", "negated POSIX"), ("\\u0041", "invalid escape"), ("a\\", "trailing"),
    ("(a", "missing ')'"), ("a)", "unmatched ')'"), ("[a", "missing closing ]"), ("[z-a]", "range"),
])
def test_what_re2_lacks_is_refused(pattern: str, message: str) -> None:
    with pytest.raises(GoRegexError, match=re.escape(message)):
        compile_go(pattern)


_atoms = st.sampled_from(["a", "b", "ab", ".", "[ab]", "[^a]", "(a|b)", "(?:ab)", "x", "\\.", "[a-c]"])
_ops = st.sampled_from(["", "*", "+", "?", "*?", "{1,2}", "|"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_atoms, _ops), min_size=1, max_size=5), st.text(alphabet="abcx.\n", max_size=6))
def test_on_the_common_subset_python_and_go_agree(parts: list[tuple[str, str]], text: str) -> None:
    pattern = "".join(a + o for a, o in parts).rstrip("|")
    want = re.fullmatch(pattern, text, re.S)
    got = compile_go(pattern).fullmatch(text)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert got.groups() == want.groups()
