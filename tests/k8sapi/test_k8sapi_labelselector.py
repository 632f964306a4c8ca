"""Kubernetes label selectors parsed as labels.Parse does, and turned into series matchers."""

from __future__ import annotations

import re

import pytest

from metricsd.k8sapi.labelselector import Requirement, SelectorError, parse_label_selector, promql_matchers, to_matchers
from metricsd.selector import MatchOp


def test_every_operator_parses() -> None:
    reqs = parse_label_selector("app=web, tier in (a,b.c),!canary,env!=prod,track,x==y,z notin (q)")
    assert reqs == [Requirement("app", "=", ("web",)), Requirement("tier", "in", ("a", "b.c")),
                    Requirement("canary", "!exists"), Requirement("env", "!=", ("prod",)),
                    Requirement("track", "exists"), Requirement("x", "=", ("y",)),
                    Requirement("z", "notin", ("q",))]


def test_requirements_become_matchers_and_promql() -> None:
    ms = to_matchers(parse_label_selector("app=web,tier in (a,b.c),!canary,track"))
    assert [(m.op, m.name, m.value) for m in ms] == [
        (MatchOp.EQ, "app", "web"), (MatchOp.RE, "tier", "a|b\\.c"), (MatchOp.EQ, "canary", ""),
        (MatchOp.NEQ, "track", "")]
    assert promql_matchers(ms) == 'app="web",tier=~"a|b\\\\.c",canary="",track!=""'
    assert ms[1].matches("b.c") and not ms[1].matches("bxc")


def test_an_empty_value_is_allowed() -> None:
    assert parse_label_selector("app=") == [Requirement("app", "=", ("",))]


@pytest.mark.parametrize(("text", "says"), [
    ("app in a", "expected '('"), ("app>1", "unknown operator"), ("=x", "expected a label key"),
    ("a=b,", "trailing ','"), ("a=-x", "invalid label value"), ("a in ()", "at least one value"),
    ("a=b c=d", "expected ','"), ("a" * 5000, "longer than"),
])
def test_bad_selectors_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(SelectorError, match=re.escape(says)):
        parse_label_selector(text)


def test_a_key_that_is_no_series_label_is_refused_by_name() -> None:
    with pytest.raises(SelectorError, match=re.escape("app.kubernetes.io/name")):
        to_matchers(parse_label_selector("app.kubernetes.io/name=web"))
