"""The data model, label matchers and durations: validation messages and matcher semantics."""

from __future__ import annotations

import math

import pytest

from metricsd.durations import parse_duration_ms
from metricsd.model import (
    InvalidSeries,
    Limits,
    is_stale,
    make_labels,
    pod_key,
    series_id,
    stale_marker,
    validate_labels,
)
from metricsd.selector import InvalidSelector, Matcher, MatchOp, matches_all, parse_selector


def test_labels_are_canonical_and_ids_stable_across_construction_order() -> None:
    a = make_labels("cpu", {"pod": "p", "namespace": "n"})
    b = make_labels(None, [("namespace", "n"), ("__name__", "cpu"), ("pod", "p")])
    assert a == b == (("__name__", "cpu"), ("namespace", "n"), ("pod", "p"))
    assert series_id(a) == series_id(b)
    assert series_id(a) != series_id(make_labels("cpu", {"pod": "p"}))
    assert pod_key(a) == "n/p"


def test_series_id_is_pinned() -> None:
    # Agents and stores on different hosts and versions must agree: a change here breaks the wire.
    assert f"{series_id(make_labels('m', {'namespace': 'a', 'pod': 'b'})):016x}" == "cfb48de9f134b0cd"


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (make_labels("cpu", {"namespace": "n"}), "required label 'pod' is missing"),
        (make_labels("cpu", {"namespace": "n", "pod": ""}), "required label 'pod' is missing or empty"),
        (make_labels("9cpu", {"namespace": "n", "pod": "p"}), "metric name '9cpu'"),
        (make_labels("x" * 300, {"namespace": "n", "pod": "p"}), "metric name is 300 bytes, more than the lim"),
        (make_labels("cpu", {"namespace": "n", "pod": "p", "__x": "1"}), "reserved"),
        (make_labels("cpu", {"namespace": "n", "pod": "p", "a.b": "1"}), "label name 'a.b'"),
        ((("namespace", "n"), ("__name__", "cpu"), ("pod", "p")), "canonical"),
        (make_labels("cpu", {"namespace": "n", "pod": "p", "v": "x" * 3000}), "value of label v is 3000 bytes"),
    ],
)
def test_invalid_series_are_named_in_the_message(labels: tuple[tuple[str, str], ...], message: str) -> None:
    with pytest.raises(InvalidSeries, match=message):
        validate_labels(labels)


def test_label_count_limit_is_configurable() -> None:
    labels = make_labels("cpu", {"namespace": "n", "pod": "p", "a": "1", "b": "2"})
    validate_labels(labels)
    with pytest.raises(InvalidSeries, match="4 labels, more than the limit of 3"):
        validate_labels(labels, Limits(max_labels=3))


@pytest.mark.parametrize(
    ("extra", "reason", "message"),
    [
        ({"v": "x" * 1025}, "label_value_length", "value of label v is 1025 bytes, more than the limit of 1024 bytes"),
        ({"v": "é" * 513}, "label_value_length", "value of label v is 1026 bytes"),  # UTF-8 bytes, not characters
        ({"n" * 257: "1"}, "label_name_length", "is 257 bytes, more than the limit of 256 bytes"),
        ({f"l{i}": "1" for i in range(31)}, "labels_per_series", "33 labels, more than the limit of 32"),
    ],
)
def test_label_limits_name_the_limit_and_its_reason(extra: dict[str, str], reason: str, message: str) -> None:
    labels = make_labels("cpu", {"namespace": "n", "pod": "p", **extra})
    with pytest.raises(InvalidSeries, match=message) as e:
        validate_labels(labels)
    assert e.value.reason == reason
    assert len(str(e.value)) < 400  # the oversized series is cut in the message


def test_label_limits_accept_their_exact_values() -> None:
    validate_labels(make_labels("cpu", {"namespace": "n", "pod": "p", "v": "é" * 512, "n" * 256: "1",
                                        **{f"l{i}": "1" for i in range(28)}}))


def test_stale_marker_is_a_specific_nan() -> None:
    assert math.isnan(stale_marker()) and is_stale(stale_marker())
    assert not is_stale(float("nan")) and not is_stale(1.0)


@pytest.mark.parametrize(
    ("matcher", "present", "absent_matches"),
    [
        (Matcher(MatchOp.EQ, "a", "x"), {"x": True, "y": False}, False),
        (Matcher(MatchOp.NEQ, "a", "x"), {"x": False, "y": True}, True),
        (Matcher(MatchOp.RE, "a", "x|y"), {"x": True, "xy": False, "y": True}, False),
        (Matcher(MatchOp.NRE, "a", "x.*"), {"xa": False, "b": True}, True),
        (Matcher(MatchOp.RE, "a", ".*"), {"anything": True, "a\nb": True}, True),
        (Matcher(MatchOp.EQ, "a", ""), {"x": False}, True),
    ],
)
def test_matchers_follow_prometheus_semantics(matcher: Matcher, present: dict[str, bool], absent_matches: bool) -> None:
    for value, want in present.items():
        assert matches_all([matcher], (("a", value),)) is want, value
    assert matches_all([matcher], ()) is absent_matches


def test_match_ops_are_spelled_as_in_promql() -> None:
    # selector_string() and error messages print op.value; it must read back as the same op
    assert MatchOp.EQ.value == "="
    assert [op.value for op in MatchOp] == ["=", "!=", "=~", "!~"]
    for op in MatchOp:
        (m,) = parse_selector(f'a{op.value}"x"')
        assert m.op is op


def test_parse_selector() -> None:
    got = parse_selector('{workload="web", pod=~"a.*",ns!="x\\"y"}', "cpu")
    assert [(m.op, m.name, m.value) for m in got] == [
        (MatchOp.EQ, "__name__", "cpu"), (MatchOp.EQ, "workload", "web"), (MatchOp.RE, "pod", "a.*"),
        (MatchOp.NEQ, "ns", 'x"y'),
    ]
    assert parse_selector("") == []
    with pytest.raises(InvalidSelector, match="cannot parse selector"):
        parse_selector("workload=web")
    with pytest.raises(InvalidSelector, match="bad regular expression"):
        parse_selector('pod=~"("')


@pytest.mark.parametrize(("text", "ms"), [("30s", 30_000), ("1m", 60_000), ("1h30m", 5_400_000), ("500ms", 500),
                                          ("7d", 604_800_000), ("15", 15_000)])
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "1x", "m", "1m2", "-1s", "1.5s"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration_ms(text)
