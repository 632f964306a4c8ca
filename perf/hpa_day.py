"""A 24-hour simulated day for the HPA, or a week of reactive and predictive HPAs side by side,
run faster than real time and plotted as a PNG.

    .venv/bin/python perf/hpa_day.py [--hours 24] [--out perf/results/hpa_day.png] [--seed 0]
    .venv/bin/python perf/hpa_day.py --week [--days 8] [--startup-minutes 5] [--horizon 30m]
                                     [--methods sameHour] [--out perf/results/hpa_week.png]

A store runs in this process (Store + LocalBackend); a Simulator's tidal load is served by the
`frontend` Deployment, whose replica count the HPA controller (log backend, plus an in-memory
scale subresource the decisions apply to) changes every 15 simulated seconds; CPU per pod is the
load divided by the replicas. The plot shows the replica curve against the load (as the replicas
the load needs at the target utilisation) and the effective min / max, which a 19:00-23:00
schedule raises. A JSON summary is written next to the PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from metricsd.cmd.daysim import DAY_START_MS, RAMP_HOURS, DayResult, DaySettings, run_day, run_days

_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS

WEEK_HPA = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {name}, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: {name}}}
  minReplicas: 4
  maxReplicas: 60
  metrics:
  - type: Resource
    resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 60}}}}
{extra}"""


def plot(result: DayResult, start_ms: int, out: Path) -> None:
    hours = [(t - start_ms) / _HOUR_MS for t in result.times_ms]
    per_replica = result.request_cores * result.target_utilization / 100.0
    needed = [load / per_replica for load in result.load_cores]
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=110)
    ax.plot(hours, needed, color="tab:orange", lw=0.8, alpha=0.8,
            label=f"load / ({result.request_cores:g} core x {result.target_utilization:g}%): replicas needed")
    ax.step(hours, result.replicas, where="post", color="tab:blue", lw=1.8, label="replicas (HPA)")
    ax.step(hours, result.min_replicas, where="post", color="tab:green", ls="--", lw=1.0,
            label="minReplicas (19:00-23:00 schedule raises it)")
    ax.step(hours, result.max_replicas, where="post", color="tab:red", ls="--", lw=1.0, label="maxReplicas")
    ax.set_xlabel("hour of the simulated day (UTC)")
    ax.set_ylabel("replicas")
    ax.set_xlim(0, max(hours) if hours else 24)
    ax.set_xticks(range(0, math.ceil(max(hours, default=24)) + 1, 2))
    ax.grid(alpha=0.3)
    load_ax = ax.twinx()
    lo, hi = ax.get_ylim()
    load_ax.set_ylim(lo * per_replica, hi * per_replica)
    load_ax.set_ylabel("load, CPU cores")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"metricsd HPA over a simulated day: {result.decisions} decisions, {result.scales} scaling actions")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_COLORS = ("tab:blue", "tab:green", "tab:purple", "tab:brown")


def _weekday(ms: int) -> str:
    return _WEEKDAYS[(ms // _DAY_MS + 3) % 7]  # 1970-01-01 was a Thursday


def _week_plot(results: list[DayResult], start_ms: int, zoom_day: int, out: Path) -> None:
    """The week: the replicas each HPA ran against the replicas the load needed. Then one day close
    up for the reactive HPA and the first predictive one: replicas, the forecast (the replicas its
    peak within the horizon needs, while in use), and the ready pods' utilisation against the target."""
    base = results[0]
    per_replica = base.request_cores * base.target_utilization / 100.0
    hours = [(t - start_ms) / _HOUR_MS for t in base.times_ms]
    needed = [load / per_replica for load in base.load_cores]
    fig, (week_ax, day_ax, util_ax) = plt.subplots(3, 1, figsize=(14, 13), dpi=100,
                                                    gridspec_kw={"height_ratios": [1.0, 1.2, 0.9]})
    week_ax.plot(hours, needed, color="tab:orange", lw=0.5, alpha=0.7,
                 label=f"replicas the load needs at the target (load / {per_replica:g} core)")
    for r, color in zip(results, _COLORS, strict=False):
        week_ax.step(hours, r.replicas, where="post", color=color, lw=0.9, label=f"replicas, {r.name}")
    week_ax.axvspan(0, 24, color="0.9", zorder=0)
    end = max(hours)
    week_ax.set_xlim(0, end)
    week_ax.set_xticks(range(0, int(end) + 1, 24))
    week_ax.set_xticklabels([f"day {d // 24}\n{_weekday(start_ms + d * _HOUR_MS)}" for d in range(0, int(end) + 1, 24)],
                            fontsize=8)
    week_ax.set_ylabel("replicas")
    week_ax.grid(alpha=0.3)
    week_ax.legend(loc="upper left", fontsize=7, ncol=2)
    week_ax.set_title("metricsd HPA over a simulated week, reactive and predictive side by side "
                      "(day 0, shaded, is history only)")

    lo, hi = zoom_day * 24 + 3.0, zoom_day * 24 + 23.0
    keep = [i for i, h in enumerate(hours) if lo <= h <= hi]
    shown = results[:2]
    day_ax.plot([hours[i] for i in keep], [needed[i] for i in keep], color="tab:orange", lw=0.7, alpha=0.8,
                label="replicas the load needs at the target")
    for r, color in zip(shown, _COLORS, strict=False):
        day_ax.step([hours[i] for i in keep], [r.replicas[i] for i in keep], where="post", color=color, lw=1.6,
                    label=f"replicas, {r.name}")
        forecast = [(hours[i], v / per_replica if r.prediction_active[i] else float("nan")) for i in keep
                    if (v := r.forecast_peak[i]) is not None]
        if forecast:
            day_ax.plot([p[0] for p in forecast], [p[1] for p in forecast], color="tab:red", ls="--", lw=0.9,
                        label=f"forecast, {r.name}: replicas its peak within the horizon needs")
    for r, color in zip(shown, _COLORS, strict=False):
        util_ax.plot([hours[i] for i in keep], [r.utilization[i] for i in keep], color=color, lw=0.7,
                     alpha=0.9, label=r.name)
    util_ax.axhline(base.target_utilization, color="0.4", ls=":", lw=1, label="target")
    util_ax.axhline(base.target_utilization * (1 + base.tolerance), color="tab:red", ls="--", lw=1,
                    label="target + tolerance")
    ticks = range(int(lo) + 1, int(hi) + 1, 2)
    for ax in (day_ax, util_ax):
        ax.set_xlim(lo, hi)
        ax.set_xticks(list(ticks))
        ax.set_xticklabels([f"{t % 24:02d}:00" for t in ticks], fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7)
    day_ax.set_ylabel("replicas")
    day_ax.set_title(f"day {zoom_day} ({_weekday(start_ms + zoom_day * _DAY_MS)}), close up", fontsize=10)
    util_ax.set_ylabel("CPU of the ready pods, % of request")
    util_ax.set_xlabel("UTC")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def _judge(r: DayResult, start_ms: int, days: int) -> dict[str, Any]:
    def day(d: int) -> dict[str, object]:
        lo, hi = start_ms + (d - 1) * _DAY_MS, start_ms + d * _DAY_MS
        return {"day": d, "weekday": _weekday(lo), "minutes_above": r.minutes_above_target(lo, hi),
                "ramp_minutes_above": r.minutes_above_target(lo, hi, ramps_only=True),
                "replica_hours": round(r.replica_hours(lo, hi), 1)}

    judged = [i for i, t in enumerate(r.times_ms) if t >= start_ms]
    reasons = [r.rules[i] for i in judged]
    return {
        "minutes_above_target": r.minutes_above_target(start_ms),
        "ramp_minutes_above_target": r.minutes_above_target(start_ms, ramps_only=True),
        "replica_hours": round(r.replica_hours(start_ms), 1), "scales": r.scales,
        "prediction_in_use_share": round(sum(r.prediction_active[i] for i in judged) / max(1, len(judged)), 3),
        "rules": {k: reasons.count(k) for k in sorted(set(reasons))}, "per_day": [day(d) for d in range(1, days + 1)],
    }


def week(args: argparse.Namespace, argv: list[str] | None) -> int:
    methods = [m for m in args.methods.split(",") if m]
    specs = [WEEK_HPA.format(name="reactive", extra="")]
    specs += [WEEK_HPA.format(name=f"predictive-{m.lower()}",
                              extra=f"  metricsd:\n    predictive: {{horizon: {args.horizon}, method: {m}}}\n")
              for m in methods]
    settings = DaySettings(duration_ms=int(args.days * _DAY_MS), seed=args.seed,
                           startup_ms=args.startup_minutes * 60_000)
    t0 = time.perf_counter()
    if args.replot:
        results = [DayResult(**d) for d in json.loads(args.replot.read_text())]
    else:
        results = asyncio.run(run_days(settings, specs))
    wall = time.perf_counter() - t0
    if args.raw:
        args.raw.write_text(json.dumps([r.to_dict() for r in results]))
    judged_from = DAY_START_MS + _DAY_MS
    out = args.out or Path(__file__).resolve().parent / "results" / "hpa_week.png"
    _week_plot(results, DAY_START_MS, args.zoom_day, out)
    figures = {r.name: _judge(r, judged_from, math.ceil(args.days) - 1) for r in results}
    reactive = figures["reactive"]
    for r in results[1:]:
        f = figures[r.name]
        f["ramp_minutes_above_vs_reactive"] = round(
            f["ramp_minutes_above_target"] / max(1e-9, reactive["ramp_minutes_above_target"]) - 1, 3)
        f["replica_hours_vs_reactive"] = round(f["replica_hours"] / reactive["replica_hours"] - 1, 4)
    summary = {
        "command": "python perf/hpa_day.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "simulated_days": args.days, "judged_days": math.ceil(args.days) - 1, "startup_minutes": args.startup_minutes,
        "horizon": args.horizon, "ramp_hours_utc": list(RAMP_HOURS),
        "above_target_limit_percent": results[0].target_utilization * (1 + results[0].tolerance),
        "wall_seconds": None if args.replot else round(wall, 1),
        "load_average": None if args.replot else [round(x, 2) for x in os.getloadavg()], "hpas": figures,
    }
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "hpas"}, indent=1))
    for name, f in figures.items():
        print(name, {k: v for k, v in f.items() if k not in ("per_day", "rules")})
    print(f"plot: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--week", action="store_true", help="reactive and predictive HPAs side by side over a week")
    p.add_argument("--days", type=float, default=8, help="--week: simulated days, the first one history only")
    p.add_argument("--startup-minutes", type=int, default=5, help="--week: how long a new pod takes to serve")
    p.add_argument("--horizon", default="30m", help="--week: the predictive HPAs' horizon")
    p.add_argument("--methods", default="sameHour", help="--week: forecast methods, comma-separated")
    p.add_argument("--zoom-day", type=int, default=2, help="--week: the day drawn close up")
    p.add_argument("--raw", type=Path, help="--week: also write every sync's row of every HPA to this JSON file")
    p.add_argument("--replot", type=Path, help="--week: draw and judge the rows of a --raw file, simulating nothing")
    args = p.parse_args(argv)
    if args.week:
        return week(args, argv)
    out = args.out or Path(__file__).resolve().parent / "results" / "hpa_day.png"
    settings = DaySettings(duration_ms=int(args.hours * _HOUR_MS), seed=args.seed)
    t0 = time.perf_counter()
    result = asyncio.run(run_day(settings))
    wall = time.perf_counter() - t0
    plot(result, DAY_START_MS, out)
    summary = {
        "command": "python perf/hpa_day.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "simulated_hours": args.hours, "wall_seconds": round(wall, 1),
        "speedup": round(args.hours * 3600 / wall), "decisions": result.decisions, "scales": result.scales,
        "replicas_min": min(result.replicas), "replicas_max": max(result.replicas),
        "replicas_at": {f"{h:02d}:00": result.at(h, DAY_START_MS) for h in range(0, int(args.hours), 2)},
        "rules": {r: result.rules.count(r) for r in sorted(set(result.rules))},
    }
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
