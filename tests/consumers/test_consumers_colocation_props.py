"""Properties of the colocation planner over simulated days: random pools, tides and timings.

The simulated cluster is as unkind as the machine allows: a drain takes a random time that may
pass its deadline, offline work leaves a random time after its notice (or never). The planner only
sees what the observations say. What must hold at every period:
- online capacity (nodes Online now) covers the forecast plus the margin, or every node is online;
- nodes in a transition are there before their deadline, and only the timeouts raise alerts;
- with no demand at all, every node above the floor is lent at the first period.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.consumers.colocation.forecast import HOUR_MS, nodes_needed, time_share
from metricsd.consumers.colocation.machine import NodeObservation, NodeState, Phase, Timing
from metricsd.consumers.colocation.planner import PlanInput, PlanSettings, PoolSpec, SurgeRule, plan

MIN = 60_000
DAY0 = 1_704_153_600_000


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    caps = draw(st.lists(st.sampled_from([4.0, 8.0, 16.0, 32.0]), min_size=1, max_size=6))
    total = sum(caps)
    hours = 40
    demand = draw(st.lists(st.floats(0.0, total, allow_nan=False), min_size=hours, max_size=hours))
    timing = Timing(
        drain_ms=draw(st.integers(1, 30)) * MIN,
        notice_ms=draw(st.integers(0, 60)) * MIN,
        return_grace_ms=draw(st.integers(1, 30)) * MIN,
        min_lend_ms=draw(st.integers(0, 240)) * MIN,
        min_online_ms=draw(st.integers(0, 60)) * MIN,
        interval_ms=draw(st.integers(5, 15)) * MIN,
    )
    return {"caps": caps, "demand": demand, "timing": timing, "margin": draw(st.floats(0.0, 0.5)),
            "keep": draw(st.integers(0, len(caps))), "seed": draw(st.integers(0, 2**16)),
            "surge_at": draw(st.none() | st.integers(0, 30))}


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_online_capacity_never_falls_short_of_a_forecast_that_holds(sc: dict[str, object]) -> None:
    caps: list[float] = sc["caps"]  # type: ignore[assignment]
    demand: list[float] = sc["demand"]  # type: ignore[assignment]
    timing: Timing = sc["timing"]  # type: ignore[assignment]
    margin: float = sc["margin"]  # type: ignore[assignment]
    rng = random.Random(sc["seed"])  # type: ignore[arg-type]
    names = tuple(f"n{i}" for i in range(len(caps)))
    cap = dict(zip(names, caps, strict=True))
    forecast: dict[int, float | None] = {DAY0 + h * HOUR_MS: d for h, d in enumerate(demand)}
    pool = PoolSpec("p", names, keep_online=sc["keep"])  # type: ignore[arg-type]
    rule = SurgeRule("s", "svc", "p", threshold=1.0, nodes=2, order="largestFirst")
    cfg = PlanSettings(margin=margin, timing=timing)
    states: dict[str, NodeState] = {}
    delay: dict[str, int] = {}  # how long the pods that must leave a node take, drawn per transition
    now = DAY0
    end = DAY0 + 30 * HOUR_MS  # the forecast reaches 10 h past the end: no unknown hour forces a return
    surge_at = sc["surge_at"]
    while now < end:
        observed = {}
        for n in names:
            s = states.get(n)
            phase = s.phase if s is not None else Phase.ONLINE
            since = s.since_ms if s is not None else 0
            leaving = now - since < delay.get(n, 0)
            observed[n] = NodeObservation(n, cap[n],
                                          online_pods=int(phase is not Phase.ONLINE_TO_OFFLINE or leaving),
                                          offline_pods=int(phase is Phase.OFFLINE
                                                           or (phase is Phase.OFFLINE_TO_ONLINE and leaving)))
        hot = surge_at is not None and now // HOUR_MS - DAY0 // HOUR_MS == surge_at
        out = plan(PlanInput(now, [pool], states, observed, {"p": forecast}, [rule], {"s": 2.0 if hot else 0.0}), cfg)
        for t in out.transitions:
            assert t.at_ms == now and t.alert == (t.reason in ("DrainTimeout", "ReturnTimeout"))
            if t.dst in (Phase.ONLINE_TO_OFFLINE, Phase.OFFLINE_TO_ONLINE):
                delay[t.node] = rng.choice([0, rng.randrange(0, 2 * (t.deadline_ms - now) + 1), 10**12])
        states = out.states
        for s in states.values():
            if s.phase in (Phase.ONLINE_TO_OFFLINE, Phase.OFFLINE_TO_ONLINE):
                assert s.deadline_ms is not None and s.deadline_ms > now
        online = sum(cap[n] for n in names if states[n].phase is Phase.ONLINE)
        need = demand[(now - DAY0) // HOUR_MS] * (1 + margin)
        assert online >= min(need, sum(caps)) - 1e-9, (now, online, need, [states[n] for n in names])
        if hot:
            assert not any(t.dst is Phase.ONLINE_TO_OFFLINE for t in out.transitions)
        now += timing.interval_ms


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([4.0, 16.0]), min_size=1, max_size=8), st.integers(0, 8))
def test_an_idle_pool_lends_every_node_above_its_floor_at_once(caps: list[float], keep: int) -> None:
    names = tuple(f"n{i}" for i in range(len(caps)))
    observed = {n: NodeObservation(n, c, online_pods=0) for n, c in zip(names, caps, strict=True)}
    forecast: dict[int, float | None] = {DAY0 + h * HOUR_MS: 0.0 for h in range(24)}
    out = plan(PlanInput(DAY0, [PoolSpec("p", names, keep)], {}, observed, {"p": forecast}), PlanSettings())
    assert len(out.transitions) == max(0, len(caps) - keep)
    assert all(t.reason == "Lend" and t.dst is Phase.ONLINE_TO_OFFLINE for t in out.transitions)
    table = [r for r in out.table if r.pool == "p"]
    assert len(table) == 24 and all(r.nodes_lendable == max(0, len(caps) - keep) for r in table)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.5, 64.0), max_size=12), st.floats(0.0, 500.0), st.integers(0, 14))
def test_nodes_needed_is_the_fewest_that_cover_the_need(caps: list[float], need: float, keep: int) -> None:
    k = nodes_needed(caps, need, keep)
    ordered = sorted(caps, reverse=True)
    if sum(ordered) >= need:
        assert sum(ordered[:k]) >= need and k >= min(keep, len(caps))
        if k > keep:  # one fewer would not do: the largest k - 1 fall short
            assert sum(ordered[:k - 1]) < need
    else:
        assert k == len(caps)
    rows = time_share("p", caps, {DAY0: need / 1.2}, DAY0, 0.2, keep, hours=1)
    assert rows[0].nodes_online + rows[0].nodes_lendable == len(caps)
    assert rows[0].cores_lendable <= sum(caps) - rows[0].need_cores + 1e-6 or rows[0].nodes_lendable == 0  # type: ignore[operator]
