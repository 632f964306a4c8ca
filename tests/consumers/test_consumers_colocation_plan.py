"""The colocation planner and its state machine, with hand-worked cases.

Pool `p`: four nodes of 16 cores (n0..n3). Timing: drain 10 min, notice 15 min, grace 5 min,
minimum lend 2 h, minimum online 30 min, period 1 min, margin 25 %.
"""

from __future__ import annotations

import math

import pytest

from metricsd.consumers.colocation.forecast import (
    HOUR_MS,
    ReplicaCurve,
    hourly_forecast,
    nodes_needed,
    peak_need,
    time_share,
)
from metricsd.consumers.colocation.machine import NodeObservation, NodeState, Phase, Timing, advance
from metricsd.consumers.colocation.planner import PlanInput, PlanSettings, PoolSpec, SurgeRule, plan

MIN = 60_000
DAY0 = 1_704_153_600_000  # 2024-01-02 00:00 UTC
NOW = DAY0 + 2 * HOUR_MS
NODES = ("n0", "n1", "n2", "n3")
POOL = PoolSpec("p", NODES)
SETTINGS = PlanSettings(margin=0.25, timing=Timing(10 * MIN, 15 * MIN, 5 * MIN, 2 * HOUR_MS, 30 * MIN, MIN))


def seen(online: int = 0, offline: int = 0, cap: float = 16.0) -> dict[str, NodeObservation]:
    return {n: NodeObservation(n, cap, online, offline) for n in NODES}


def flat(cores: float, hours: int = 48, start: int = DAY0) -> dict[int, float | None]:
    return {start + i * HOUR_MS: cores for i in range(hours)}


def run(states: dict[str, NodeState], forecast: dict[int, float | None], now: int = NOW,
        observed: dict[str, NodeObservation] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    inp = PlanInput(now, [POOL], states, observed if observed is not None else seen(), {"p": forecast}, **kw)  # type: ignore[arg-type]
    return plan(inp, SETTINGS)


# --- the state machine ------------------------------------------------------------------------


def test_only_the_four_moves_and_the_aborts_exist() -> None:
    st = NodeState("n0", "p")
    with pytest.raises(ValueError, match="no move from Online to Offline"):
        st.move(Phase.OFFLINE, NOW, "x", "y")
    with pytest.raises(ValueError, match="deadline"):
        st.move(Phase.ONLINE_TO_OFFLINE, NOW, "x", "y")
    draining, moved = st.move(Phase.ONLINE_TO_OFFLINE, NOW, "Lend", "m", NOW + 10 * MIN)
    assert (moved.src, moved.dst, moved.at_ms, moved.deadline_ms, moved.reason) == (
        Phase.ONLINE, Phase.ONLINE_TO_OFFLINE, NOW, NOW + 10 * MIN, "Lend")
    lent, _ = draining.move(Phase.OFFLINE, NOW + MIN, "Drained", "m")
    assert lent.lent_since_ms == NOW + MIN and lent.deadline_ms is None
    back, _ = lent.move(Phase.OFFLINE_TO_ONLINE, NOW + HOUR_MS, "Forecast", "m", NOW + HOUR_MS + 20 * MIN)
    online, _ = back.move(Phase.ONLINE, NOW + HOUR_MS + 5 * MIN, "Returned", "m")
    assert online.lent_since_ms is None and online.phase is Phase.ONLINE


def test_a_drain_finishes_when_no_online_pod_is_left_and_is_abandoned_at_its_deadline() -> None:
    st, _ = NodeState("n0", "p").move(Phase.ONLINE_TO_OFFLINE, NOW, "Lend", "m", NOW + 10 * MIN)
    same, moved = advance(st, NodeObservation("n0", 16, online_pods=2), NOW + 9 * MIN)
    assert same is st and moved is None
    done, moved = advance(st, NodeObservation("n0", 16, online_pods=0, offline_pods=3), NOW + 5 * MIN)
    assert done.phase is Phase.OFFLINE and moved is not None and moved.reason == "Drained" and not moved.alert
    back, moved = advance(st, NodeObservation("n0", 16, online_pods=2), NOW + 10 * MIN)
    assert back.phase is Phase.ONLINE and moved is not None
    assert (moved.reason, moved.alert) == ("DrainTimeout", True) and ": 2;" in moved.message
    unseen, moved = advance(st, None, NOW + 10 * MIN)
    assert unseen.phase is Phase.ONLINE and moved is not None and "no metrics" in moved.message


def test_a_return_ends_when_offline_work_has_left_or_evicts_it_at_the_deadline() -> None:
    st = NodeState("n0", "p", Phase.OFFLINE_TO_ONLINE, NOW, "Forecast", NOW + 20 * MIN, NOW - HOUR_MS)
    done, moved = advance(st, NodeObservation("n0", 16, online_pods=0, offline_pods=0), NOW + MIN)
    assert done.phase is Phase.ONLINE and moved is not None and moved.reason == "Returned"
    stuck, moved = advance(st, NodeObservation("n0", 16, offline_pods=4), NOW + 20 * MIN)
    assert stuck.phase is Phase.ONLINE and moved is not None and (moved.reason, moved.alert) == ("ReturnTimeout", True)


# --- forecast ----------------------------------------------------------------------------------


def test_the_forecast_is_the_larger_of_yesterday_and_the_planned_curves() -> None:
    h0, h1, h2 = DAY0 + 24 * HOUR_MS, DAY0 + 25 * HOUR_MS, DAY0 + 26 * HOUR_MS
    yesterday = {DAY0: 10.0, DAY0 + HOUR_MS: 3.0, DAY0 + 3 * HOUR_MS: math.nan}
    curves = [ReplicaCurve("a", {h1: 8, h2: 2}, 0.5), ReplicaCurve("b", {h1: 2}, 1.0)]
    # h2: a curve alone does not make an hour known (it says nothing of the pool's other pods).
    assert hourly_forecast([h0, h1, h2, h2 + HOUR_MS], yesterday, curves) == {
        h0: 10.0, h1: 6.0, h2: None, h2 + HOUR_MS: None}


def test_the_peak_need_spans_every_overlapping_hour_and_unknown_is_infinite() -> None:
    fc: dict[int, float | None] = {DAY0: 4.0, DAY0 + HOUR_MS: 8.0, DAY0 + 2 * HOUR_MS: None}
    assert peak_need(fc, DAY0 + 30 * MIN, DAY0 + 59 * MIN, 0.5) == 6.0
    assert peak_need(fc, DAY0 + 30 * MIN, DAY0 + HOUR_MS, 0.5) == 12.0
    assert math.isinf(peak_need(fc, DAY0, DAY0 + 2 * HOUR_MS, 0.5))


def test_nodes_needed_takes_the_largest_first_and_keeps_the_floor() -> None:
    assert nodes_needed([4, 16, 8], 17) == 2
    assert nodes_needed([4, 16, 8], 0) == 0
    assert nodes_needed([4, 16, 8], 0, keep_online=1) == 1
    assert nodes_needed([4, 16, 8], 100) == 3
    rows = time_share("p", [4, 16, 8], {DAY0: 10.0, DAY0 + HOUR_MS: None}, DAY0, 0.5, hours=2,
                      utc_offset_minutes=480)
    assert (rows[0].nodes_online, rows[0].nodes_lendable, rows[0].cores_lendable, rows[0].local_hour) == (1, 2, 12, 8)
    assert (rows[1].nodes_lendable, rows[1].need_cores) == (0, None)


# --- the plan ----------------------------------------------------------------------------------


def test_a_quiet_pool_lends_all_but_what_the_forecast_needs() -> None:
    # 20 cores * 1.25 = 25 > 16: two nodes must stay online; the two lent have no online pods first.
    obs = {"n0": NodeObservation("n0", 16, 3), "n1": NodeObservation("n1", 16, 0),
           "n2": NodeObservation("n2", 16, 1), "n3": NodeObservation("n3", 16, 5)}
    p = run({}, flat(20.0), observed=obs)
    lent = [t for t in p.transitions if t.dst is Phase.ONLINE_TO_OFFLINE]
    assert [t.node for t in lent] == ["n1", "n2"]
    assert all(t.reason == "Lend" and t.deadline_ms == NOW + 10 * MIN for t in lent)
    assert p.pools["p"]["Online"] == 2 and p.pools["p"]["onlineCores"] == 32.0


def test_nothing_is_lent_when_the_forecast_is_unknown_within_the_time_away() -> None:
    fc = flat(1.0, hours=4)  # known until 04:00 only; a lend from 02:00 is away until past 04:00
    assert run({}, fc).transitions == []


def test_a_coming_peak_returns_nodes_one_return_time_ahead() -> None:
    # 8 cores until 03:00, then 40 (* 1.25 = 50 > 48): all four nodes are needed from 03:00.
    fc = flat(8.0)
    for h in range(3, 48):
        fc[DAY0 + h * HOUR_MS] = 40.0
    lent_at = NOW - 3 * HOUR_MS
    states = {n: NodeState(n, "p", Phase.OFFLINE, lent_at, "Drained", None, lent_at) for n in ("n1", "n2", "n3")}
    early = run(states, fc, now=DAY0 + 3 * HOUR_MS - 22 * MIN)
    assert early.transitions == []  # 02:38 + 20 min return + 1 min period < 03:00
    due = run(states, fc, now=DAY0 + 3 * HOUR_MS - 21 * MIN)
    moved = due.transitions
    assert sorted(t.node for t in moved) == ["n1", "n2", "n3"]
    assert all(t.dst is Phase.OFFLINE_TO_ONLINE and t.reason == "Forecast" for t in moved)
    assert all(t.deadline_ms == DAY0 + 3 * HOUR_MS - MIN for t in moved)


def test_a_drain_is_cancelled_before_a_lent_node_is_recalled() -> None:
    fc = flat(20.0)  # needs 25 cores: two nodes
    lent_at = NOW - 3 * HOUR_MS
    states = {"n1": NodeState("n1", "p", Phase.ONLINE_TO_OFFLINE, NOW - MIN, "Lend", NOW + 9 * MIN),
              "n2": NodeState("n2", "p", Phase.OFFLINE, lent_at, "Drained", None, lent_at),
              "n3": NodeState("n3", "p", Phase.OFFLINE, lent_at, "Drained", None, lent_at)}
    p = run(states, fc, observed=seen(online=1))
    (t,) = p.transitions
    assert (t.node, t.src, t.dst, t.reason) == ("n1", Phase.ONLINE_TO_OFFLINE, Phase.ONLINE, "Forecast")
    assert "drain cancelled" in t.message


def test_min_lend_is_honoured_unless_online_capacity_needs_the_node() -> None:
    fc = flat(20.0)
    young = NOW - 10 * MIN
    states = {"n2": NodeState("n2", "p", Phase.OFFLINE, young, "Drained", None, young),
              "n3": NodeState("n3", "p", Phase.OFFLINE, young, "Drained", None, young)}
    assert run(states, fc).transitions == []  # 32 online >= 25: they stay lent
    fc_high = flat(30.0)  # 37.5 > 32: one must come back, even before its minimum lend
    (t,) = run(states, fc_high).transitions
    assert t.dst is Phase.OFFLINE_TO_ONLINE and "before its minimum lend" in t.message


def test_a_node_back_online_is_not_lent_again_before_min_online() -> None:
    back = NodeState("n0", "p", Phase.ONLINE, NOW - 10 * MIN, "DrainTimeout")
    p = run({"n0": back}, flat(1.0))
    assert "n0" not in {t.node for t in p.transitions}
    assert {t.node for t in p.transitions} == {"n1", "n2", "n3"}


def test_keep_online_holds_nodes_back() -> None:
    inp = PlanInput(NOW, [PoolSpec("p", NODES, keep_online=3)], {}, seen(), {"p": flat(0.0)})
    p = plan(inp, SETTINGS)
    assert len(p.transitions) == 1


def test_a_surge_takes_back_lent_nodes_at_once_in_the_stated_order() -> None:
    states = {n: NodeState(n, "p", Phase.OFFLINE, NOW - (i + 3) * HOUR_MS, "Drained", None, NOW - (i + 1) * HOUR_MS)
              for i, n in enumerate(("n1", "n2", "n3"))}
    rule = SurgeRule("spike", "shop/checkout", "p", threshold=30.0, nodes=2, order="newestLent")
    calm = run(states, flat(1.0), surge_rules=[rule], surge_load={"spike": 29.9})
    assert calm.transitions == [] and not calm.surges[0].active
    hot = run(states, flat(1.0), surge_rules=[rule], surge_load={"spike": 30.0})
    assert hot.surges[0].taken_back == ("n1", "n2")  # lent 1 h and 2 h ago: the newest first
    assert all(t.reason == "Surge" and t.deadline_ms == NOW + MIN + 5 * MIN for t in hot.transitions)
    oldest = run(states, flat(1.0), surge_rules=[SurgeRule("spike", "s", "p", 30.0, 2, "oldestLent")],
                 surge_load={"spike": 31.0})
    assert oldest.surges[0].taken_back == ("n3", "n2")
    assert not any(t.dst is Phase.ONLINE_TO_OFFLINE for t in hot.transitions)  # no lending while hot
    # The next round of the same episode takes back no more than the rule's two in all.
    later = run(hot.states, flat(1.0), now=NOW + MIN, surge_rules=[rule], surge_load={"spike": 40.0},
                surge_taken={"spike": 2})
    assert later.surges[0].active and later.surges[0].taken_back == ()
    assert [t.reason for t in later.transitions] == ["Returned", "Returned"]  # n1, n2: their offline pods left
    one_more = run(hot.states, flat(1.0), now=NOW + MIN, surge_rules=[rule], surge_load={"spike": 40.0},
                   surge_taken={"spike": 1})
    assert one_more.surges[0].taken_back == ("n3",)


def test_a_node_in_two_pools_is_refused() -> None:
    inp = PlanInput(NOW, [PoolSpec("a", ("n0",)), PoolSpec("b", ("n0",))], {}, seen(), {})
    with pytest.raises(ValueError, match="n0 is in two pools"):
        plan(inp, SETTINGS)


def test_a_lend_looks_ahead_for_as_long_as_the_node_would_be_away() -> None:
    # Away at the least: drain 10 min + min lend 2 h + return 20 min + period 1 min = 2 h 31 min.
    # A peak (40 cores * 1.25 = 50: all four nodes) starting at 05:00 forbids any lend from 02:29 on.
    fc = flat(1.0)
    for h in range(5, 48):
        fc[DAY0 + h * HOUR_MS] = 40.0
    assert run({}, fc, now=DAY0 + 5 * HOUR_MS - 151 * MIN).transitions == []
    lent = run({}, fc, now=DAY0 + 5 * HOUR_MS - 152 * MIN).transitions
    assert len(lent) == 3 and all(t.reason == "Lend" for t in lent)
