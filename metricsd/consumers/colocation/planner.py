"""One round of the lending plan, pure: node states, what the metrics show, the forecast and the
surge rules in; the nodes' new states, the moves and the time-share table out.

The order of a round, per pool:
1. Transitions finish (drained, offline work gone) or are abandoned at their deadline (`machine`).
2. Surge: a rule whose service's load has passed its threshold takes back up to `nodes` of the
   pool's lent nodes at once (once per episode above the threshold): drains in progress first
   (cancelling one costs nothing), then lent nodes in the rule's order; the pool lends nothing
   while any rule is hot.
3. Returns: the nodes online now plus those on their way back must cover the forecast over the
   longest a return can take plus one period; if not, drains are cancelled first (those nodes are
   still whole), then lent nodes come back, the ones past their minimum lend and the largest first.
4. Lends: an online node is lent only when the nodes online without it cover the forecast for as
   long as it would be away at the least (drain + minimum lend + return + one period). Nodes with
   the fewest online pods and the least capacity go first: cheapest to drain, least lost.

Why that keeps online capacity whole when the forecast holds: a node counts against a moment t
only if it will be online at t. A lend is checked against every t it can overlap, counting only
nodes online now; a return is started one return-time (plus a period) before the hour that needs
it, so returning nodes are back by then. The property tests run this against a simulated week.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from metricsd.consumers.colocation.forecast import HOUR_MS, TableRow, peak_need, time_share
from metricsd.consumers.colocation.machine import NodeObservation, NodeState, Phase, Timing, Transition, advance

__all__ = ["SURGE_ORDERS", "Plan", "PlanInput", "PlanSettings", "PoolSpec", "SurgeDecision", "SurgeRule", "plan"]

SurgeOrder = Literal["newestLent", "oldestLent", "largestFirst", "name"]
SURGE_ORDERS: tuple[str, ...] = ("newestLent", "oldestLent", "largestFirst", "name")


@dataclass(frozen=True)
class PoolSpec:
    """A pool's nodes (resolved to names) and how many of them never leave online service."""

    name: str
    nodes: tuple[str, ...]
    keep_online: int = 0


@dataclass(frozen=True)
class SurgeRule:
    """Take back up to `nodes` lent nodes of `pool` at once when `service`'s load passes `threshold`."""

    name: str
    service: str
    pool: str
    threshold: float
    nodes: int
    order: SurgeOrder = "newestLent"


@dataclass(frozen=True)
class PlanSettings:
    margin: float = 0.2
    timing: Timing = field(default_factory=Timing)
    surge_notice_ms: int = 60_000
    utc_offset_minutes: int = 0
    table_hours: int = 24


@dataclass(frozen=True)
class PlanInput:
    """now; the pools; every node's state (absent: Online since forever); the observations (absent:
    not seen); the forecast per pool by UTC hour start; the surge rules' services' load now, and how
    many nodes each rule has already taken back in its current episode (it takes `nodes` in all
    while its service stays above the threshold, not `nodes` more every round)."""

    now_ms: int
    pools: Sequence[PoolSpec]
    states: Mapping[str, NodeState]
    observed: Mapping[str, NodeObservation]
    forecast: Mapping[str, Mapping[int, float | None]]
    surge_rules: Sequence[SurgeRule] = ()
    surge_load: Mapping[str, float | None] = field(default_factory=dict)
    surge_taken: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SurgeDecision:
    rule: str
    pool: str
    load: float | None
    threshold: float
    active: bool
    taken_back: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    states: dict[str, NodeState]
    transitions: list[Transition]
    table: list[TableRow]
    surges: list[SurgeDecision]
    pools: dict[str, dict[str, float | int]]

    @property
    def alerts(self) -> list[Transition]:
        return [t for t in self.transitions if t.alert]


def _cap(observed: Mapping[str, NodeObservation], node: str) -> float:
    seen = observed.get(node)
    return seen.capacity_cores if seen is not None else 0.0


def _surge_key(order: SurgeOrder, st: NodeState, cap: float) -> tuple[float, str]:
    lent = st.lent_since_ms if st.lent_since_ms is not None else st.since_ms
    if order == "newestLent":
        return (-lent, st.name)
    if order == "oldestLent":
        return (lent, st.name)
    if order == "largestFirst":
        return (-cap, st.name)
    return (0.0, st.name)


def _fmt_time(ms: int) -> str:
    return f"{ms // HOUR_MS % 24:02d}:{ms // 60_000 % 60:02d}"


class _Round:
    """The mutable bookkeeping of one round; `plan` is the pure face of it."""

    def __init__(self, inp: PlanInput, settings: PlanSettings) -> None:
        self.inp = inp
        self.s = settings
        self.now = inp.now_ms
        self.states: dict[str, NodeState] = dict(inp.states)
        self.moves: list[Transition] = []

    def state(self, node: str, pool: str) -> NodeState:
        st = self.states.get(node)
        if st is None or st.pool != pool:
            st = NodeState(node, pool, Phase.ONLINE, since_ms=0)
            self.states[node] = st
        return st

    def move(self, st: NodeState, dst: Phase, reason: str, message: str, deadline_ms: int | None = None,
             alert: bool = False) -> None:
        new, moved = st.move(dst, self.now, reason, message, deadline_ms, alert)
        self.states[st.name] = new
        self.moves.append(moved)

    def give_back(self, st: NodeState, reason: str, message: str, notice_ms: int) -> None:
        """Cancel a drain (the node is whole at once) or start a return with its notice."""
        if st.phase is Phase.ONLINE_TO_OFFLINE:
            self.move(st, Phase.ONLINE, reason, f"drain cancelled: {message}")
        else:
            grace = self.s.timing.return_grace_ms
            self.move(st, Phase.OFFLINE_TO_ONLINE, reason, f"{message}; offline work told to leave",
                      self.now + notice_ms + grace)

    def pool(self, spec: PoolSpec) -> list[SurgeDecision]:
        obs = self.inp.observed
        t = self.s.timing
        forecast = self.inp.forecast.get(spec.name, {})
        for node in spec.nodes:
            new, moved = advance(self.state(node, spec.name), obs.get(node), self.now)
            self.states[node] = new
            if moved is not None:
                self.moves.append(moved)

        surges = self._surge(spec)
        hot = any(s.active for s in surges)

        def nodes_in(*phases: Phase) -> list[NodeState]:
            return [self.states[n] for n in spec.nodes if self.states[n].phase in phases]

        # 3. Returns: what is online or coming back must cover the longest return plus a period.
        horizon = self.now + t.return_ms + t.interval_ms
        need = peak_need(forecast, self.now, horizon, self.s.margin)
        committed = sum(_cap(obs, st.name) for st in nodes_in(Phase.ONLINE, Phase.OFFLINE_TO_ONLINE))
        if committed < need:
            draining = sorted(nodes_in(Phase.ONLINE_TO_OFFLINE), key=lambda st: (-_cap(obs, st.name), st.name))
            lent = sorted(nodes_in(Phase.OFFLINE),
                          key=lambda st: (self.now - (st.lent_since_ms or 0) < t.min_lend_ms, -_cap(obs, st.name),
                                          st.name))
            for st in draining + lent:
                if committed >= need:
                    break
                early = (st.phase is Phase.OFFLINE and st.lent_since_ms is not None
                         and self.now - st.lent_since_ms < t.min_lend_ms)
                what = "unknown" if math.isinf(need) else f"{need:.1f} cores"
                note = " (before its minimum lend)" if early else ""
                self.give_back(st, "Forecast", f"online needs {what} by {_fmt_time(horizon)}, "
                               f"{committed:.1f} online or returning{note}", t.notice_ms)
                committed += _cap(obs, st.name)

        # 4. Lends, counting only the nodes online now.
        if not hot:
            away = self.now + t.drain_ms + t.min_lend_ms + t.return_ms + t.interval_ms
            need_away = peak_need(forecast, self.now, away, self.s.margin)
            online_nodes = nodes_in(Phase.ONLINE)
            online = sum(_cap(obs, st.name) for st in online_nodes)
            count = len(online_nodes)
            candidates = sorted(
                (st for st in online_nodes if st.name in obs and self.now - st.since_ms >= t.min_online_ms),
                key=lambda st: (obs[st.name].online_pods, obs[st.name].capacity_cores, st.name))
            for st in candidates:
                cap = obs[st.name].capacity_cores
                if count - 1 < spec.keep_online or online - cap < need_away:
                    continue
                self.move(st, Phase.ONLINE_TO_OFFLINE, "Lend",
                          f"online needs at most {need_away:.1f} cores until {_fmt_time(away)}; "
                          f"{online - cap:.1f} stay online; {obs[st.name].online_pods} online pods to drain",
                          self.now + t.drain_ms)
                online -= cap
                count -= 1
        return surges

    def _surge(self, spec: PoolSpec) -> list[SurgeDecision]:
        out = []
        obs = self.inp.observed
        for rule in self.inp.surge_rules:
            if rule.pool != spec.name:
                continue
            load = self.inp.surge_load.get(rule.name)
            active = load is not None and load >= rule.threshold
            taken: list[str] = []
            if active:
                lent = [self.states[n] for n in spec.nodes
                        if self.states[n].phase in (Phase.ONLINE_TO_OFFLINE, Phase.OFFLINE)]
                lent.sort(key=lambda st: (st.phase is Phase.OFFLINE, *_surge_key(rule.order, st, _cap(obs, st.name))))
                for st in lent[:max(0, rule.nodes - self.inp.surge_taken.get(rule.name, 0))]:
                    self.give_back(st, "Surge", f"{rule.service} at {load:.1f} >= {rule.threshold:g} "
                                   f"(surge rule {rule.name})", self.s.surge_notice_ms)
                    taken.append(st.name)
            out.append(SurgeDecision(rule.name, spec.name, load, rule.threshold, active, tuple(taken)))
        return out


def plan(inp: PlanInput, settings: PlanSettings) -> Plan:
    """One round for every pool. Nodes of no pool keep their states untouched. Raises ValueError
    when a node is named by two pools."""
    seen: set[str] = set()
    for spec in inp.pools:
        dup = seen.intersection(spec.nodes)
        if dup:
            raise ValueError(f"node {sorted(dup)[0]} is in two pools")
        seen.update(spec.nodes)
    rnd = _Round(inp, settings)
    surges: list[SurgeDecision] = []
    table: list[TableRow] = []
    pools: dict[str, dict[str, float | int]] = {}
    first_hour = inp.now_ms // HOUR_MS * HOUR_MS
    for spec in inp.pools:
        surges.extend(rnd.pool(spec))
        caps = [_cap(inp.observed, n) for n in spec.nodes]
        table.extend(time_share(spec.name, caps, inp.forecast.get(spec.name, {}), first_hour, settings.margin,
                                spec.keep_online, settings.table_hours, settings.utc_offset_minutes))
        counts: dict[str, float | int] = {p.value: 0 for p in Phase}
        for n in spec.nodes:
            counts[rnd.states[n].phase.value] = int(counts[rnd.states[n].phase.value]) + 1
        counts["onlineCores"] = sum(_cap(inp.observed, n) for n in spec.nodes
                                    if rnd.states[n].phase is Phase.ONLINE)
        counts["lentCores"] = sum(_cap(inp.observed, n) for n in spec.nodes
                                  if rnd.states[n].phase is not Phase.ONLINE)
        pools[spec.name] = counts
    return Plan(rnd.states, rnd.moves, table, surges, pools)
