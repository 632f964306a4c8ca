"""The limits before a PromQL query runs: the linear pre-scan (unit and property tests against
Prometheus' own test queries), admission, the engine's deadline, and the lag window."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from promql_script_format import EvalCmd, parse_script

from metricsd.http.looplag import LagWindow
from metricsd.promql import Engine, MemorySource, PromQLError
from metricsd.promql.limits import Admission, QueryLimitError, QueryLimits, count_operators, prescan

TESTDATA = Path(__file__).resolve().parents[2].parent / "shared" / "peer" / "promql" / "testdata"


def corpus() -> list[str]:
    out = []
    for path in sorted(TESTDATA.glob("*.test")):
        try:
            out += [c.expr for c in parse_script(path.read_text()) if isinstance(c, EvalCmd)]
        except ValueError:
            continue
    return out


@pytest.mark.parametrize("query, ops, depth", [
    ("up", 0, 0),
    ('sum by (a) (rate(x{a=~"b|c+", d!="e"}[5m])) / on(a) group_left sum(y)', 1, 3),
    ("x >= bool 3", 1, 0),
    ("x and y or z unless w", 3, 0),
    ('x{a="1+2"} - 1 # a comment: + - * /', 1, 1),
    ("'a+b' + \"c\\\"+d\" + `e+f`", 2, 0),
    ("((((x))))", 0, 4),
])
def test_operators_are_counted_outside_strings_matchers_and_comments(query: str, ops: int, depth: int) -> None:
    assert count_operators(query) == (ops, depth)


def test_each_limit_names_itself_and_its_flag() -> None:
    limits = QueryLimits(max_length=100, max_depth=3, max_operators=4)
    cases = [("x" * 101, "the query is 101 characters long; the limit is 100 (--query.max-length)", "max_length"),
             ("((((x))))", "the query nests 4 levels deep; the limit is 3 (--query.max-depth)", "max_depth"),
             ("+".join(["1"] * 6), "the query has 5 binary operators; the limit is 4 (--query.max-operators)",
              "max_operators")]
    for query, message, limit in cases:
        with pytest.raises(QueryLimitError) as e:
            prescan(query, limits)
        assert (e.value.kind, e.value.message, e.value.limit) == ("bad_data", message, limit)
    prescan("1+1+1+1+1", limits)


def test_no_query_of_prometheus_own_test_scripts_is_refused_by_the_defaults() -> None:
    queries = corpus()
    assert len(queries) > 500
    for q in queries:
        prescan(q, QueryLimits())


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("x1+-*/(){}[]\"'`#=!<> \n\\and")), max_size=300))
def test_the_prescan_is_total_and_bounded_by_the_length(text: str) -> None:
    ops, depth = count_operators(text)
    assert 0 <= ops <= len(text) and depth <= len(text)


async def test_admission_runs_a_limited_number_queues_some_and_refuses_the_rest() -> None:
    admission = Admission(QueryLimits(max_concurrency=1, max_queued=1))
    release = asyncio.Event()

    async def hold() -> None:
        async with admission:
            await release.wait()

    first = asyncio.create_task(hold())
    await asyncio.sleep(0)
    second = asyncio.create_task(hold())  # waits for the slot
    await asyncio.sleep(0)
    assert (admission.running, admission.waiting) == (1, 1)
    with pytest.raises(QueryLimitError) as e:
        async with admission:
            pass
    assert e.value.kind == "unavailable" and "1 running and 1 waiting" in e.value.message
    release.set()
    await asyncio.gather(first, second)
    assert (admission.running, admission.waiting, admission.refused) == (0, 0, 1)


def test_the_engine_stops_at_its_deadline() -> None:
    engine = Engine(MemorySource(), deadline=time.monotonic() - 1)
    with pytest.raises(PromQLError) as e:
        engine.instant("1 + 1", 0)
    assert (e.value.kind, e.value.message) == ("timeout", "query timed out in expression evaluation")
    assert Engine(MemorySource(), deadline=time.monotonic() + 60).instant("1 + 1", 0) is not None


def test_the_lag_window_keeps_the_largest_lag_of_its_window() -> None:
    w = LagWindow(window_s=10)
    assert w.observe(0.0, 0.5) == 0.5
    assert w.observe(1.0, 0.1) == 0.5
    assert w.observe(10.5, 0.2) == 0.2  # the 0.5 at t=0 has left the window
    assert w.observe(11.0, 0.0) == 0.2


async def test_the_runner_answers_timeout_once_its_deadline_passed() -> None:
    from metricsd.promql.queries import QueryRunner
    from metricsd.store.api import LocalBackend, StoreAPI
    from metricsd.store.engine import Store

    runner = QueryRunner(LocalBackend(StoreAPI(Store())), timeout_s=1e-9)
    with pytest.raises(QueryLimitError) as e:
        await runner.instant("1 + 1", 0)
    assert (e.value.kind, e.value.limit) == ("timeout", "timeout")
    assert (await QueryRunner(LocalBackend(StoreAPI(Store()))).instant("1 + 1", 0))[1] == "engine"


class _StuckBackend:
    """A store in this process whose reads never finish (a read stuck behind a slow disk or peer)."""

    def __init__(self) -> None:
        from metricsd.store.api import LocalBackend, StoreAPI
        from metricsd.store.engine import Store

        self.local = LocalBackend(StoreAPI(Store()))
        self.never = asyncio.Event()

    async def read_selection(self, *args: Any, **kwargs: Any) -> Any:
        await self.never.wait()
        raise AssertionError("unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)


async def test_the_runner_times_a_read_itself_when_its_limit_is_shorter_than_the_callers() -> None:
    """The caller's own limit (``timeout_s``, which the caller enforces) spares the runner its timer
    only when it is not longer than the runner's: a shorter server limit still cuts a stuck read."""
    from metricsd.promql.queries import QueryRunner

    runner = QueryRunner(_StuckBackend(), timeout_s=0.05)  # type: ignore[arg-type]
    for caller in (None, 30.0):
        started = time.monotonic()
        with pytest.raises(QueryLimitError) as e:
            await asyncio.wait_for(runner.range("rate(x[1m])", 0, 60_000, 30_000, timeout_s=caller), 20)
        assert (e.value.kind, e.value.limit) == ("timeout", "timeout")
        assert "0.05 s" in e.value.message
        assert time.monotonic() - started < 10


async def test_the_callers_limit_cuts_a_stuck_read_when_the_runners_is_not_shorter() -> None:
    """At the same limit the caller's timer (started first) answers, with the caller's error."""
    from metricsd.promql.queries import QueryRunner

    runner = QueryRunner(_StuckBackend(), timeout_s=0.05)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await runner.range("rate(x[1m])", 0, 60_000, 30_000, timeout_s=0.05)


async def test_a_repeated_query_text_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from metricsd.promql import queries

    calls: list[str] = []
    real = queries.parse

    def counting(text: str) -> tuple[Any, dict[int, int]]:
        calls.append(text)
        return real(text)

    from metricsd.store.api import LocalBackend, StoreAPI
    from metricsd.store.engine import Store

    monkeypatch.setattr(queries, "parse", counting)
    runner = queries.QueryRunner(LocalBackend(StoreAPI(Store())))
    first = await runner.instant("1 + 2", 0)
    second = await runner.instant("1 + 2", 60_000)
    assert calls == ["1 + 2"]
    assert first[0].value == second[0].value == 3.0  # type: ignore[union-attr]
    with pytest.raises(PromQLError):  # a text that does not parse is not kept: it fails every time
        await runner.instant("1 +", 0)
    with pytest.raises(PromQLError):
        await runner.instant("1 +", 0)
    assert calls == ["1 + 2", "1 +", "1 +"]
