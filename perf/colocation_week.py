"""A simulated week of the colocation lending plan, run faster than real time, plotted as a PNG.

    .venv/bin/python perf/colocation_week.py [--days 7] [--out perf/results/colocation_week.png] [--seed 0]

A store runs in this process; a pool of 12 nodes of 32 cores carries a tidal online service and a
shadow service with one flash sale; the ColocationController (the real one, on the in-memory
backend) plans every simulated minute and the simulated cluster follows its moves (see
metricsd/cmd/colocationsim.py). The plot shows the online cores requested against the capacity of
the nodes online and the forecast need, and below it the lent nodes. A JSON summary (node-hours
lent, shortfall, transitions per day) is written next to the PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from metricsd.cmd.colocationsim import WeekResult, WeekSettings, run_week

_HOUR_MS = 3_600_000


def plot(result: WeekResult, s: WeekSettings, summary: dict[str, object], out: Path) -> None:
    days = [(t - s.start_ms) / (24 * _HOUR_MS) for t in result.times_ms]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 7.5), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1.4]})
    top.step(days, result.online_cores, where="post", color="tab:blue", lw=1.4, label="capacity of Online nodes")
    need = [float("nan") if n is None else n for n in result.need_cores]
    top.plot(days, need, color="tab:green", lw=0.9, ls="--", label="forecast * (1 + margin): the plan's need")
    top.plot(days, result.requested_cores, color="tab:orange", lw=0.9, label="online pods' CPU requests")
    top.plot(days, [a + b for a, b in zip(result.load_cores, result.checkout_cores, strict=True)], color="tab:red",
             lw=0.6, alpha=0.7, label="online CPU use (frontend + checkout)")
    surge = [d for d, on in zip(days, result.surge, strict=True) if on]
    if surge:
        top.axvspan(min(surge), max(surge), color="tab:purple", alpha=0.15, label="surge rule active (flash sale)")
    top.set_ylabel("cores")
    top.set_ylim(0, s.nodes * s.node_cores * 1.05)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", fontsize=8, ncol=2)
    lent = [p["Offline"] for p in result.phases]
    moving = [p["OnlineToOffline"] + p["OfflineToOnline"] for p in result.phases]
    bottom.stackplot(days, lent, moving, step="post", colors=["tab:gray", "tab:olive"],
                     labels=["Offline (lent)", "in transition"])
    bottom.set_ylabel("nodes")
    bottom.set_ylim(0, s.nodes)
    bottom.set_xlabel("day of the simulated week (Monday 00:00 UTC = 0)")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper left", fontsize=8)
    top.set_title(f"metricsd colocation plan over a simulated week: {summary['node_hours_lent']} node-hours lent, "
                  f"shortfall {summary['shortfall_core_minutes']} core-minutes, {summary['transitions']} moves")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "colocation_week.png")
    args = p.parse_args(argv)
    settings = WeekSettings(days=args.days, seed=args.seed)
    t0 = time.perf_counter()
    result = asyncio.run(run_week(settings))
    wall = time.perf_counter() - t0
    summary = {
        "command": "python perf/colocation_week.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "wall_seconds": round(wall, 1), "speedup": round(args.days * 86_400 / wall),
        "pool": {"nodes": settings.nodes, "node_cores": settings.node_cores},
        **result.summary(60_000, settings.node_cores),
        "alerts_detail": [{k: t[k] for k in ("time", "node", "from", "to", "reason")}
                          for t in result.transitions if t["alert"]],
        "surge_moves": [{k: t[k] for k in ("time", "node", "from", "to")}
                        for t in result.transitions if t["reason"] == "Surge"],
    }
    plot(result, settings, summary, args.out)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
