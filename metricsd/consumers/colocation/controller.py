"""The colocation loop: read nodes, pods and yesterday's demand, run one round of the pure planner,
and carry each move out through the backend (log, webhook or Kubernetes).

Offline schedulers hear of every lend and return as a `colocation.notice` (published through the
backend, and through the alerts webhook when one is set); a stuck transition is a
`colocation.alert`. A move the backend could not carry out is retried on the next sync with the
node's then-current state, so a Kubernetes node catches up with the plan once the API answers.

The node states are the plan's memory: without them a restarted controller would take lent nodes
for online ones. With a state file they are written after every sync and read at the first.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from metricsd.clock import Clock
from metricsd.consumers.actuators.base import Actuator, ActuatorError, NodeChange
from metricsd.consumers.colocation.forecast import HOUR_MS, hourly_forecast
from metricsd.consumers.colocation.machine import NodeState, Phase, Transition
from metricsd.consumers.colocation.observe import ColocationObserver, planned_curve
from metricsd.consumers.colocation.planner import Plan, PlanInput, PoolSpec, plan
from metricsd.consumers.colocation.spec import ColocationSpec
from metricsd.consumers.history import DecisionLog, iso_time
from metricsd.consumers.hpa.spec import HPASpec
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable

__all__ = ["ColocationController", "load_states", "save_states"]

log = logging.getLogger("metricsd.consumers.colocation")
_FORECAST_HOURS = 24


def transition_doc(t: Transition) -> dict[str, Any]:
    return {"node": t.node, "pool": t.pool, "from": t.src.value, "to": t.dst.value, "time": iso_time(t.at_ms),
            "timeMs": t.at_ms, "reason": t.reason, "message": t.message, "alert": t.alert,
            "deadline": iso_time(t.deadline_ms) if t.deadline_ms is not None else None,
            "deadlineMs": t.deadline_ms}


def save_states(path: Path, states: dict[str, NodeState]) -> None:
    """Write atomically (a crash mid-write leaves the previous file)."""
    doc = {name: {**asdict(st), "phase": st.phase.value} for name, st in sorted(states.items())}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def load_states(path: Path) -> dict[str, NodeState]:
    """The states of a file save_states wrote; none when it does not exist. Raises ValueError."""
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
        return {name: NodeState(**{**st, "phase": Phase(st["phase"])}) for name, st in doc.items()}
    except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a colocation state file: {e}") from e


class ColocationController:
    """Not safe to share across event loops; `sync_once` must not run concurrently with itself."""

    name = "colocation"

    def __init__(self, spec: ColocationSpec, backend: MetricsBackend, actuator: Actuator, clock: Clock,
                 hpas: list[HPASpec] | None = None, alerts: Actuator | None = None, state_file: Path | None = None,
                 observer: ColocationObserver | None = None, history: int = 50) -> None:
        self.spec = spec
        self.actuator = actuator
        self.alerts = alerts
        self.clock = clock
        self.hpas = {(h.namespace, h.name): h for h in hpas or []}
        self.observer = observer or ColocationObserver(backend)
        self.state_file = state_file
        self.states: dict[str, NodeState] = load_states(state_file) if state_file is not None else {}
        self.unapplied: set[str] = set()
        self.surge_taken: dict[str, int] = {}
        self.log = DecisionLog(history)
        self.moves: deque[dict[str, Any]] = deque(maxlen=500)
        self.syncs = 0
        self.errors = 0
        self.last: dict[str, Any] | None = None
        self.last_plan: Plan | None = None
        # Yesterday's hours are over: their rollups are read once per hour, not once per sync.
        self._past: dict[tuple[object, ...], Any] = {}
        self._past_hour = -1

    @property
    def interval_s(self) -> float:
        return self.spec.interval_s

    async def sync_once(self) -> dict[str, Any]:
        now_ms = self.clock.now_ms()
        self.syncs += 1
        try:
            result = await self._plan(now_ms)
        except (Unavailable, BadRequest) as e:
            self.errors += 1
            entry = {"time": iso_time(now_ms), "timeMs": now_ms, "consumer": "colocation", "plan": self.spec.name,
                     "inputs": {}, "rule": "Unavailable", "message": f"cannot read the metrics now: {e}; "
                     "no node moves", "result": {"errors": [str(e)]}}
            self.last = self.log.record(entry)
            return self.last
        errors = await self._act(result, now_ms)
        if self.state_file is not None:
            try:
                save_states(self.state_file, self.states)
            except OSError as e:
                errors.append(f"saving states: {e}")
        self.last = self.log.record(self._entry(result, now_ms, errors))
        return self.last

    async def _plan(self, now_ms: int) -> Plan:
        observed = await self.observer.nodes(now_ms)
        names = sorted(observed)
        # A node away from online service stays in its pool's plan while its metrics are missing:
        # otherwise a lent node that stops reporting would never be called back.
        away = {n for n, st in self.states.items() if st.phase is not Phase.ONLINE}
        pools = [PoolSpec(sel.name, tuple(sorted({*sel.select(names)} | {n for n in away
                                                                           if self.states[n].pool == sel.name})),
                          sel.keep_online) for sel in self.spec.pools]
        all_nodes = sorted({n for p in pools for n in p.nodes})
        first = now_ms // HOUR_MS * HOUR_MS
        hours = [first + i * HOUR_MS for i in range(_FORECAST_HOURS)]
        if first != self._past_hour:
            self._past, self._past_hour = {}, first
        key: tuple[object, ...] = ("pools", tuple(all_nodes))
        if key not in self._past:
            self._past[key] = await self.observer.yesterday(all_nodes, now_ms, _FORECAST_HOURS)
        past = self._past[key]
        forecast: dict[str, dict[int, float | None]] = {}
        for pool in pools:
            curves = []
            for c in self.spec.curves:
                if c.pool == pool.name:
                    ckey: tuple[object, ...] = ("curve", c.namespace, c.hpa)
                    if ckey not in self._past:
                        self._past[ckey] = await self.observer.workload_replicas_yesterday(
                            c.namespace, c.hpa, now_ms, _FORECAST_HOURS)
                    replicas = self._past[ckey]
                    curves.append(planned_curve(c, self.hpas.get((c.namespace, c.hpa)), replicas, hours))
            forecast[pool.name] = hourly_forecast(hours, past.pool_demand(set(pool.nodes)), curves)
        load: dict[str, float | None] = {}
        for rule in self.spec.surge:
            ns, workload = self.spec.surge_services[rule.name]
            load[rule.name] = await self.observer.workload_cores(ns, workload, now_ms)
        result = plan(PlanInput(now_ms, pools, self.states, observed, forecast, self.spec.surge, load,
                                self.surge_taken), self.spec.settings)
        self.states = result.states
        for s in result.surges:
            self.surge_taken[s.rule] = self.surge_taken.get(s.rule, 0) + len(s.taken_back) if s.active else 0
        self.last_plan = result
        return result

    def _change(self, node: str, src: Phase, dst: Phase, reason: str, deadline_ms: int | None,
                decision: dict[str, Any]) -> NodeChange:
        m = self.spec.marks
        return NodeChange(node, self.states[node].pool, src.value, dst.value, reason, deadline_ms, m.state_label,
                          m.lent_taint, m.return_taint, evict_online=self.spec.evict and dst is Phase.ONLINE_TO_OFFLINE,
                          evict_offline=reason == "ReturnTimeout", decision=decision)

    async def _act(self, result: Plan, now_ms: int) -> list[str]:
        errors: list[str] = []
        moved = {t.node for t in result.transitions}
        for node in sorted(self.unapplied - moved):  # catch up with the state a failed move left behind
            st = self.states.get(node)
            if st is None:
                self.unapplied.discard(node)
                continue
            try:
                await self.actuator.set_node(self._change(node, st.phase, st.phase, st.reason, st.deadline_ms,
                                                          {"retry": True}))
                self.unapplied.discard(node)
            except ActuatorError as e:
                errors.append(f"node {node}: {e}")
        for t in result.transitions:
            doc = transition_doc(t)
            self.moves.append(doc)
            (log.warning if t.alert else log.info)("node %s: %s -> %s (%s): %s", t.node, t.src, t.dst, t.reason,
                                                   t.message)
            try:
                await self.actuator.set_node(self._change(t.node, t.src, t.dst, t.reason, t.deadline_ms, doc))
                self.unapplied.discard(t.node)
            except ActuatorError as e:
                self.unapplied.add(t.node)
                errors.append(f"node {t.node}: {e}")
            kind = "colocation.alert" if t.alert else (
                "colocation.notice" if t.dst in (Phase.ONLINE_TO_OFFLINE, Phase.OFFLINE_TO_ONLINE) else None)
            if kind is None:
                continue
            for sink in (self.actuator, self.alerts):
                if sink is None:
                    continue
                try:
                    await sink.publish(kind, doc)
                except ActuatorError as e:
                    errors.append(f"publishing {kind} for {t.node}: {e}")
        return errors

    def _entry(self, result: Plan, now_ms: int, errors: list[str]) -> dict[str, Any]:
        moves = [transition_doc(t) for t in result.transitions]
        lent = sum(int(c.get("Offline", 0)) for c in result.pools.values())
        rule = "Alert" if result.alerts else "Moved" if moves else "Steady"
        summary = "; ".join(f"{name}: {int(c['Online'])} online, {int(c['OnlineToOffline'])} draining, "
                            f"{int(c['Offline'])} lent, {int(c['OfflineToOnline'])} returning"
                            for name, c in result.pools.items())
        hot = [s.rule for s in result.surges if s.active]
        message = f"{len(moves)} moves; {summary}" + (f"; surge: {', '.join(hot)}" if hot else "")
        return {
            "time": iso_time(now_ms), "timeMs": now_ms, "consumer": "colocation", "plan": self.spec.name,
            "inputs": {"nodes": len(result.states), "lent": lent},
            "rule": rule, "message": message,
            "result": {
                "transitions": moves,
                "pools": result.pools,
                "nodes": [{"node": st.name, "pool": st.pool, "phase": st.phase.value, "reason": st.reason,
                           "since": iso_time(st.since_ms), "deadline": iso_time(st.deadline_ms)
                           if st.deadline_ms is not None else None}
                          for st in sorted(result.states.values(), key=lambda s: (s.pool, s.name))],
                "table": [{"pool": r.pool, "hour": r.local_hour, "hourStart": iso_time(r.hour_start_ms),
                           "forecastCores": r.forecast_cores, "needCores": r.need_cores,
                           "capacityCores": r.capacity_cores, "nodes": r.nodes, "nodesOnline": r.nodes_online,
                           "nodesLendable": r.nodes_lendable, "coresLendable": r.cores_lendable}
                          for r in result.table],
                "surges": [{"rule": s.rule, "pool": s.pool, "load": s.load, "threshold": s.threshold,
                            "active": s.active, "takenBack": list(s.taken_back)} for s in result.surges],
                "errors": errors,
            },
        }

    def history(self) -> list[dict[str, Any]]:
        return self.log.entries()

    def status(self) -> dict[str, Any]:
        last = self.last or {}
        return {"consumer": "colocation", "backend": self.actuator.name, "intervalSeconds": self.interval_s,
                "plan": self.spec.name, "decisions": self.log.recorded, "syncs": self.syncs, "errors": self.errors,
                "rule": last.get("rule"), "message": last.get("message"), "lastSync": last.get("time"),
                "latest": last.get("result"), "recentTransitions": list(self.moves)[-50:]}
