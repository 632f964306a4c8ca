"""A selector node's matchers are kept per node (promql/selectors.py to_matchers): a repeat of a
query text (the parsed-query cache hands out the same AST) converts its selectors once. The kept
answer must be the node's own, a fresh list each call, and the memory bounded."""

from __future__ import annotations

import pytest

from metricsd.promql import PromQLError, selectors
from metricsd.promql.engine import parse
from metricsd.selector import Matcher, MatchOp


def _selector(text: str) -> object:
    ast = parse(f"rate({text}[1m])")[0]
    return ast.args[0].vector_selector


def test_each_node_keeps_its_own_matchers_and_callers_get_a_new_list() -> None:
    a, b = _selector('m{pod="p1",ns=~"a.*"}'), _selector('n{pod="p2"}')
    first = selectors.to_matchers(a)
    assert first == [Matcher(MatchOp.EQ, "__name__", "m"), Matcher(MatchOp.EQ, "pod", "p1"),
                     Matcher(MatchOp.RE, "ns", "a.*")]
    first.append(Matcher(MatchOp.EQ, "x", "y"))  # a caller's change is not kept
    assert selectors.to_matchers(a) == first[:3]
    assert selectors.to_matchers(a) is not selectors.to_matchers(a)
    assert selectors.to_matchers(b) == [Matcher(MatchOp.EQ, "__name__", "n"), Matcher(MatchOp.EQ, "pod", "p2")]


def test_kept_matchers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selectors, "_MATCHERS_KEPT", 8)
    monkeypatch.setattr(selectors, "_matchers", {})
    nodes = [_selector(f'm{{pod="p{i}"}}') for i in range(30)]
    for i, node in enumerate(nodes):
        assert selectors.to_matchers(node)[1] == Matcher(MatchOp.EQ, "pod", f"p{i}")
        assert len(selectors._matchers) <= 8
    assert selectors.to_matchers(nodes[0])[1].value == "p0"  # converted again once dropped


def test_a_bad_selector_is_refused_every_time() -> None:
    node = _selector('m{a=~"(?<n>x)"}')  # a named group in Perl's form, which RE2 and Prometheus refuse
    for _ in range(2):
        with pytest.raises(PromQLError):
            selectors.to_matchers(node)
