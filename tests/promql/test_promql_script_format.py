"""The test-script parser against the examples in the format's description."""

from __future__ import annotations

import math

import pytest
from promql_script_check import float_equal
from promql_script_format import (
    HISTOGRAM,
    ClearCmd,
    EvalCmd,
    LoadCmd,
    ScriptError,
    expand_values,
    is_stale_value,
    parse_duration,
    parse_script,
    parse_series_desc,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("0", 0), ("0s", 0), ("50m", 3_000_000), ("1m30s", 90_000), ("20s500ms", 20_500), ("1y", 31_536_000_000)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("bad", ["", "5", "1s1m", "1.5s", "-1s"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(ScriptError):
        parse_duration(bad)


def test_expanding_notation() -> None:
    assert expand_values("0+10x10") == [float(10 * i) for i in range(11)]
    assert expand_values("-2+4x3") == [-2.0, 2.0, 6.0, 10.0]
    assert expand_values("1-2x4") == [1.0, -1.0, -3.0, -5.0, -7.0]
    assert expand_values("1 -2x4") == [1.0] + [-2.0] * 5
    assert expand_values("1 _ 3") == [1.0, None, 3.0]
    assert expand_values("_x3 1x2") == [None, None, None, 1.0, 1.0, 1.0]
    vals = expand_values("stale NaN -Inf .2 1e3")
    assert is_stale_value(vals[0]) and math.isnan(vals[1]) and not is_stale_value(vals[1])  # type: ignore[arg-type]
    assert vals[2:] == [-math.inf, 0.2, 1000.0]
    assert expand_values("{{schema:1 sum:5 buckets:[1 2]}}x2 7") == [HISTOGRAM] * 3 + [7.0]
    assert expand_values("{{count:1}}+{{count:2}}x1") == [HISTOGRAM] * 2


def test_series_descriptions() -> None:
    assert parse_series_desc('foo{a="1", b = "x y",} 1 2') == ((("__name__", "foo"), ("a", "1"), ("b", "x y")), " 1 2")
    assert parse_series_desc('{__name__="foo"}')[0] == (("__name__", "foo"),)
    assert parse_series_desc("{} 3")[0] == ()
    assert parse_series_desc(r'm:x{le="+Inf", q="a\"b"}')[0] == (("__name__", "m:x"), ("le", "+Inf"), ("q", 'a"b'))


SCRIPT = """
# comment
load 5m
    http_requests{job="api", instance="0"}  0+10x10
    http_requests{job="api", instance="0"}  5
    b 1 2 stale

eval instant at 50m sum by (job) (http_requests)
    {job="api"} 300
# a comment ends the block
eval range from 0 to 10m step 5m b
    b 1 2

eval instant at 1m scalar(b)
    expect fail msg: nope
    1

clear
eval_fail instant at 0 x
"""


def test_script_commands_and_blocks() -> None:
    cmds = parse_script(SCRIPT)
    assert [type(c) for c in cmds] == [LoadCmd, EvalCmd, EvalCmd, EvalCmd, ClearCmd, EvalCmd]
    load = cmds[0]
    assert isinstance(load, LoadCmd) and load.step_ms == 300_000
    assert load.series[(("__name__", "http_requests"), ("instance", "0"), ("job", "api"))] == [5.0]  # last wins
    ev = cmds[1]
    assert isinstance(ev, EvalCmd) and ev.time_ms == 3_000_000 and ev.expr == "sum by (job) (http_requests)"
    assert ev.series[0].labels == (("job", "api"),) and ev.line == 8
    rng = cmds[2]
    assert isinstance(rng, EvalCmd) and rng.range and (rng.start_ms, rng.end_ms, rng.step_ms) == (0, 600_000, 300_000)
    sc = cmds[3]
    assert isinstance(sc, EvalCmd) and sc.fail and sc.fail_msg == "nope" and sc.scalar == 1.0 and sc.series == []
    last = cmds[5]
    assert isinstance(last, EvalCmd) and last.fail and last.time_ms == 0


def test_a_scalar_result_ends_the_block() -> None:
    with pytest.raises(ScriptError, match="unknown command"):
        parse_script("eval instant at 0 1\n  1\n  {} 2\n")


def test_float_equality_rules() -> None:
    assert float_equal(math.nan, math.nan)
    assert float_equal(math.inf, math.inf) and not float_equal(math.inf, -math.inf)
    assert float_equal(1.0, 1.0 + 1e-9) and not float_equal(1.0, 1.001)
    assert not float_equal(0.0, 1e-300)  # zero must match exactly
