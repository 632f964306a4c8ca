"""A 24-hour simulated day for the HPA, run faster than real time, plotted as a PNG.

    .venv/bin/python perf/hpa_day.py [--hours 24] [--out perf/results/hpa_day.png] [--seed 0]

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
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from metricsd.cmd.daysim import DAY_START_MS, DayResult, DaySettings, run_day

_HOUR_MS = 3_600_000


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "hpa_day.png")
    args = p.parse_args(argv)
    settings = DaySettings(duration_ms=int(args.hours * _HOUR_MS), seed=args.seed)
    t0 = time.perf_counter()
    result = asyncio.run(run_day(settings))
    wall = time.perf_counter() - t0
    plot(result, DAY_START_MS, args.out)
    summary = {
        "command": "python perf/hpa_day.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "simulated_hours": args.hours, "wall_seconds": round(wall, 1),
        "speedup": round(args.hours * 3600 / wall), "decisions": result.decisions, "scales": result.scales,
        "replicas_min": min(result.replicas), "replicas_max": max(result.replicas),
        "replicas_at": {f"{h:02d}:00": result.at(h, DAY_START_MS) for h in range(0, int(args.hours), 2)},
        "rules": {r: result.rules.count(r) for r in sorted(set(result.rules))},
    }
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
