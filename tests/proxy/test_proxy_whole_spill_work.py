"""The spill by queued work (metricsd/proxy/wholeorder.py, ProxySettings.whole_spill_work_s and
whole_spill_cheap_s): the pure order and the learnt costs, then the proxy with three real stores
(whole_query_harness.py), cheap queries started together kept on one store, heavy ones spread."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_cluster import fast_settings
from whole_query_harness import QUERIES, Harness, learn_slow, rates_together

from metricsd.cmd.cluster import ClusterPlan, proxies_argv
from metricsd.cmd.cluster import add_arguments as cluster_add_arguments
from metricsd.cmd.proxy import add_arguments as proxy_add_arguments
from metricsd.proxy.settings import ProxySettings
from metricsd.proxy.wholeorder import QueryCosts, query_shape, whole_order

FULL = ["s0", "s1", "s2"]
EVERY = set(FULL)


def test_a_shape_is_the_text_and_its_step_count_not_its_times() -> None:
    assert query_shape("up", False, 0, 3_600_000, 30_000) == query_shape("up", False, 45_000, 3_645_000, 30_000)
    assert query_shape("up", False, 0, 3_600_000, 30_000) == ("up", False, 121)
    assert query_shape("up", False, 0, 7_200_000, 30_000) != query_shape("up", False, 0, 3_600_000, 30_000)
    assert query_shape("up", True, 5, 5, 1) == query_shape("up", True, 9, 9, 1) == ("up", True, 1)
    assert query_shape("up", False, 10, 0, 0) == ("up", True, 1)  # no step: one point
    assert query_shape("up", False, 10, 0, 5) == ("up", False, 1)  # an end before the start: one step


def test_a_cost_is_a_low_quantile_of_the_last_window_of_lone_answers() -> None:
    costs = QueryCosts(window=4, quantile=0.25)
    assert costs.cost(("q", True, 1)) is None
    for t in (0.010, 0.002, 0.004, 0.008):
        costs.observe(("q", True, 1), t)
    assert costs.cost(("q", True, 1)) == 0.004  # sorted 2, 4, 8, 10 ms: index int(0.25 * 4) = 1
    costs.observe(("q", True, 1), 0.020)  # 0.010 leaves the window: 2, 4, 8, 20
    assert costs.cost(("q", True, 1)) == 0.004
    costs.observe(("q", True, 1), 0.030)  # 0.002 leaves: 4, 8, 20, 30
    assert costs.cost(("q", True, 1)) == 0.008
    costs.observe(("q", True, 1), -1.0)  # a clock that stepped back: ignored
    assert costs.cost(("q", True, 1)) == 0.008
    one = QueryCosts(window=16, quantile=0.25)
    one.observe(("r", True, 1), 0.003)
    assert one.cost(("r", True, 1)) == 0.003  # a single answer is the cost


def test_costs_keep_at_most_limit_shapes_the_least_recently_measured_forgotten() -> None:
    costs = QueryCosts(limit=2)
    a, b, c = ("a", True, 1), ("b", True, 1), ("c", True, 1)
    costs.observe(a, 0.001)
    costs.observe(b, 0.002)
    costs.observe(a, 0.001)  # a measured again: b is now the oldest
    costs.observe(c, 0.003)
    assert len(costs) == 2
    assert costs.cost(b) is None and costs.cost(a) == 0.001 and costs.cost(c) == 0.003


@pytest.mark.parametrize("bad", [{"window": 0}, {"quantile": 1.5}, {"quantile": -0.1}, {"limit": 0}])
def test_costs_refuse_settings_out_of_range(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="QueryCosts"):
        QueryCosts(**bad)


def test_cheap_queries_stay_on_the_first_store_within_the_bound_heavy_ones_spread() -> None:
    def order(busy: dict[str, int], queued: dict[str, float], cost: float, bound: float = 0.010,
              cheap: float = 0.003, turn: int = 0) -> list[str]:
        return whole_order(FULL, EVERY, busy, 0, turn, 1, queued=queued, cost=cost, bound_s=bound, cheap_s=cheap)

    assert order({}, {}, 0.050) == FULL  # nothing under way: the first store, whatever the cost
    assert order({"s0": 3}, {"s0": 0.006}, 0.002) == FULL  # 6 + 2 <= 10 ms
    assert order({"s0": 4}, {"s0": 0.008}, 0.002) == FULL  # 8 + 2: just within
    assert order({"s0": 5}, {"s0": 0.009}, 0.002)[0] == "s1"  # 9 + 2 > 10: the least busy, in turn
    assert order({"s0": 5}, {"s0": 0.009}, 0.002, turn=2)[0] == "s2"
    assert order({"s0": 1}, {"s0": 0.001}, 0.004)[0] == "s1"  # heavy (4 > 3 ms): joins no queue
    assert order({"s0": 1}, {"s0": 0.001}, 0.003) == FULL  # at the threshold: cheap
    assert order({"s0": 1}, {"s0": 0.001}, 0.001, bound=0.0, cheap=1.0)[0] == "s1"  # no bound: the count alone
    assert whole_order(FULL, EVERY, {"s0": 1}, 0, 0, 1, cost=0.001, bound_s=1.0, cheap_s=1.0)[0] == "s1"  # no queue


@given(st.sets(st.integers(0, 2), min_size=1), st.dictionaries(st.integers(0, 2), st.integers(0, 9)),
       st.dictionaries(st.integers(0, 2), st.floats(0, 0.05)), st.floats(0, 0.05), st.floats(0, 0.05),
       st.floats(0, 0.05), st.integers(0, 9), st.integers(0, 9), st.integers(1, 4))
def test_the_first_store_is_kept_exactly_when_the_count_or_the_bound_allows(
        up: set[int], busy: dict[int, int], work: dict[int, float], cost: float, bound: float, cheap: float,
        first: int, turn: int, spill: int) -> None:
    ok = {f"s{i}" for i in up}
    in_flight = {f"s{i}": v for i, v in busy.items()}
    queued = {f"s{i}": v for i, v in work.items()}
    out = whole_order(FULL, ok, in_flight, first, turn, spill, queued=queued, cost=cost, bound_s=bound, cheap_s=cheap)
    start = [m for m in FULL[first % 3:] + FULL[:first % 3] if m in ok]
    assert sorted(out) == sorted(start)
    head = start[0]
    fits = bound > 0 and cost <= cheap and queued.get(head, 0.0) + cost <= bound
    if len(start) < 2 or in_flight.get(head, 0) < spill or fits:
        assert out == start
    else:
        assert in_flight.get(out[0], 0) == min(in_flight.get(m, 0) for m in start)
        assert out[1:] == [m for m in start if m != out[0]]


def test_the_bound_and_the_threshold_are_within_a_minute() -> None:
    for name in ("whole_spill_work_s", "whole_spill_cheap_s"):
        for bad in (-0.001, 61.0, float("nan")):
            with pytest.raises(ValueError, match=name):
                fast_settings(**{name: bad})


def _answered(h: Harness) -> list[int]:
    return [n.service.answered for n in h.nodes.values() if n.service is not None]


async def _spread(h: Harness, n: int) -> list[int]:
    before = _answered(h)
    answers = await rates_together(h, n)
    assert all(a is not None and a.data for a in answers), answers
    return [a - b for a, b in zip(_answered(h), before, strict=True)]


# the bound holds any number of this test's cheap queries (a loaded machine's answer times
# vary); "cheap" is set either side of one pod's rate's answer time; the heavy case's spread in any order
@pytest.mark.parametrize(("harness", "spread"),
                         [({"settings": {"whole_spill_work_s": 60.0, "whole_spill_cheap_s": 30.0}}, [8, 0, 0]),
                          ({"settings": {"whole_spill_work_s": 60.0, "whole_spill_cheap_s": 1e-9}}, [3, 3, 2])],
                         indirect=["harness"])
async def test_cheap_queries_started_together_share_the_first_store_heavy_ones_spread(
        harness: Harness, spread: list[int]) -> None:
    """Before the query's shape is learnt it counts as heavy (spread, as at a spill of 1); once
    learnt, eight started together all go to the first store when it is cheap, and spread as before
    when it is not. Each query's expected work is given back as it ends."""
    path = harness.proxy.whole_queries
    learn_slow(harness, path.latency.settings.max_s)  # no hedge under load
    assert await _spread(harness, 3) == [1, 1, 1]  # not learnt yet
    for _ in range(3):  # one after another: each alone at the first store, its answer time learnt
        await rates_together(harness, 1)
    shape = query_shape(QUERIES[3], True, 0, 0, 1)
    assert path.costs.cost(shape) is not None
    learnt, cheap = len(path.costs._times[shape]), harness.counter("whole_query_cheap")
    got = await _spread(harness, 8)
    # the stores' own time for each query: every answer learnt (test_proxy_whole_cost.py)
    assert len(path.costs._times[shape]) - learnt == 8
    assert harness.counter("whole_query_cheap") - cheap == (8 if spread[0] == 8 else 0)
    assert got == spread if spread[0] == 8 else sorted(got) == sorted(spread), got
    assert sum(path.in_flight.values()) == 0
    assert all(v == 0.0 for v in path.queued.values())  # exactly: no rounding left over


async def test_each_ask_counts_its_expected_work_until_it_ends_and_none_is_left_over(harness: Harness) -> None:
    """``queued`` is the sum of the expected work under way, and exactly 0 once none is: costs that
    do not add up exactly in floating point (0.1 + 0.2 - 0.1 - 0.2 is 2.8e-17) leave no residue."""
    path = harness.proxy.whole_queries
    path._enter("store-x", 0.1)
    path._enter("store-x", 0.2)
    assert path.queued["store-x"] == pytest.approx(0.3) and path.in_flight["store-x"] == 2 == path.under_way
    path._leave("store-x", 0.1)
    assert path.queued["store-x"] == pytest.approx(0.2)
    path._leave("store-x", 0.2)
    assert path.queued["store-x"] == 0.0 and path.in_flight["store-x"] == 0 == path.under_way


def test_cluster_up_hands_the_work_bound_to_every_proxy_and_refuses_one_out_of_range() -> None:
    up, proxy = argparse.ArgumentParser(), argparse.ArgumentParser()
    cluster_add_arguments(up)
    proxy_add_arguments(proxy)

    def proxy_args(*argv: str) -> argparse.Namespace:
        plan = ClusterPlan(stores=1, proxies=1, config_servers=1, proxy_args=proxies_argv(up.parse_args(["up", *argv])))
        return proxy.parse_args(list(plan.proxy_specs()[0].args))

    got = proxy_args("--spill-queued-ms", "8", "--spill-cheap-ms", "1.5")
    assert (got.spill_queued_ms, got.spill_cheap_ms) == (8.0, 1.5)
    own = proxy_args()
    assert own.spill_queued_ms == ProxySettings.whole_spill_work_s * 1000  # the proxy's own default
    assert own.spill_cheap_ms == ProxySettings.whole_spill_cheap_s * 1000
    for flag in ("--spill-queued-ms", "--spill-cheap-ms"):
        with pytest.raises(ValueError, match=flag):
            proxies_argv(up.parse_args(["up", flag, "60001"]))


def test_the_default_cost_is_the_least_of_the_last_32_lone_answers() -> None:
    costs = QueryCosts()
    shape = ("q", True, 1)
    costs.observe(shape, 0.0001)  # the quickest, then 32 slower ones push it out of the window
    for i in range(32):
        costs.observe(shape, 0.002 + i * 1e-5)
    assert costs.cost(shape) == 0.002
    costs.observe(shape, 0.0015)
    assert costs.cost(shape) == 0.0015
