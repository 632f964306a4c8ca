"""The CPU one store spends on a dashboard question inside its process, without HTTP or a client
(issue 23): perf/compare_workload.py's seeded workload is written to a ``Store`` through a
``LocalBackend``, then (b), ``rate()`` of one pod's CPU counter over 1 h at a 30 s step, is asked
through ``QueryRunner.range`` and its answer written as /api/v1/query_range's JSON body, back to
back; the figure is the process CPU per question (``time.process_time``), split into the store's
read, the evaluation and the body by running each part alone the same number of times. ``request_us``
is the whole hot-path request without a socket: the bytes aiohttp's client sends parsed
(http/hotpath.py ``parse_request``), answered by build_app's HotQueries, the response's bytes made.

Run beside other trees to compare them in the same minutes: each ``--variant NAME=DIR`` runs in
its own process with PYTHONPATH=DIR (a ``git archive`` or worktree of another commit), the
variants alternated for ``--rounds`` rounds.

    .venv/bin/python perf/bench_query_cpu.py                          # this tree, 3 rounds
    .venv/bin/python perf/bench_query_cpu.py --variant base=/tmp/base --rounds 4 --queries 3000
    .venv/bin/python perf/bench_query_cpu.py --cprofile 30            # where this tree's time goes
    .venv/bin/python perf/bench_query_cpu.py --cprofile 30 --request  # the same for the whole hot-path request
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    """Feed one store, then time (b) and its parts; runs the metricsd on sys.path (PYTHONPATH)."""
    sys.path.insert(1, str(HERE))
    from compare_http import http_questions
    from compare_workload import Workload, WorkloadConfig

    from metricsd.http.hotpath import parse_request
    from metricsd.http.jsonbody import dumps
    from metricsd.promql import to_prometheus_json
    from metricsd.promql.prefetch import _request, plan_fetches
    from metricsd.promql.queries import QueryRunner
    from metricsd.promql.selectors import EvalContext
    from metricsd.promql.source import MemorySource
    from metricsd.store.api import LocalBackend, StoreAPI
    from metricsd.store.engine import Store
    try:
        from metricsd.http.hotpath import response_bytes
    except ImportError:  # a tree from before response_bytes: its head built the same way
        def response_bytes(status: int, body: bytes, extra: str, close: bool) -> bytes:
            from metricsd.http.hotpath import _date
            return (f"HTTP/1.1 {status} OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                    f"Content-Length: {len(body)}\r\nDate: {_date()}\r\nServer: x\r\n{extra}\r\n"
                    ).encode("latin-1") + body

    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000
    wl = Workload(WorkloadConfig(end_ms=end, ticks=round(args.hours * 360), live_ticks=10).scaled(args.scale))
    api = StoreAPI(Store())
    backend = LocalBackend(api)
    runner = QueryRunner(backend)
    cfg = wl.config

    async def main() -> dict[str, Any]:
        for live in (False, True):
            for ticks in wl.blocks(live):
                for b in wl.next_block(ticks, cfg.live_series if live else cfg.backfill_series):
                    resp = await backend.write(b.grpc)
                    assert resp.samples_written == b.samples, resp
        at = wl.last_ms + 5_000
        big = next(p for p in wl.sim.pods() if p.workload == "big")
        q = next(q for q in http_questions(at, big.pod, "default") if q.key == "b")

        async def whole() -> None:
            res, _ = await runner.range(q.promql, q.start_ms, q.end_ms, q.step_ms)
            dumps({"status": "success", "data": to_prometheus_json(res)})

        await whole()
        ast = runner._parsed[q.promql][0]
        steps = np.arange(q.start_ms, q.end_ms + 1, q.step_ms, dtype=np.int64)
        ctx = EvalContext(MemorySource(), q.start_ms, q.end_ms, q.step_ms, steps, runner.lookback_ms,
                          runner.max_samples, {})
        request = _request(plan_fetches(ast, ctx)[0], 0, 0)
        res, _ = await runner.range(q.promql, q.start_ms, q.end_ms, q.step_ms)

        async def read() -> None:
            await backend.read_columns(request)

        async def body() -> None:
            dumps({"status": "success", "data": to_prometheus_json(res)})

        hot, raw = _hot_request(backend, q)

        async def hot_request() -> None:
            req = parse_request(raw)
            assert req is not None
            status, body, extra = await hot.answer(req, "127.0.0.1")
            assert status == 200, body
            response_bytes(status, body, extra, False)

        out: dict[str, Any] = {"points": sum(len(s.timestamps) for s in res.series)}
        if args.cprofile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.queries):
                await (hot_request if args.request else whole)()
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(args.cprofile)
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.cprofile)
        for name, fn in (("whole_us", whole), ("read_us", read), ("body_us", body), ("request_us", hot_request)):
            for _ in range(args.queries // 10):
                await fn()
            t0 = time.process_time()
            for _ in range(args.queries):
                await fn()
            out[name] = (time.process_time() - t0) / args.queries * 1e6
        return out

    return asyncio.run(main())


def _hot_request(backend: Any, q: Any) -> tuple[Any, bytes]:
    """The hot path's HotQueries of an app over ``backend`` (http/server.py's build_app, default
    settings), and (b) as aiohttp's client sends it (perf/compare_queries.py's promql_get)."""
    from urllib.parse import urlencode

    from prometheus_client import CollectorRegistry

    from metricsd.clock import SystemClock
    from metricsd.http.server import HOT_KEY, build_app
    from metricsd.http.settings import HttpSettings

    app = build_app(backend, settings=HttpSettings(), registry=CollectorRegistry(), clock=SystemClock())
    query = urlencode({"query": q.promql, "start": f"{q.start_ms / 1000:.3f}", "end": f"{q.end_ms / 1000:.3f}",
                       "step": f"{q.step_ms / 1000:g}"})
    raw = (f"GET /api/v1/query_range?{query} HTTP/1.1\r\nHost: 127.0.0.1:9090\r\nUser-Agent: Python/3.11 "
           f"aiohttp/3.9\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n\r\n").encode()
    return app[HOT_KEY], raw


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=0.2, help="of compare.py's 10,000 pods (default 0.2)")
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--queries", type=int, default=2000, help="per part and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="print cProfile's top N (one round)")
    p.add_argument("--request", action="store_true", help="--cprofile the whole hot-path request (request_us)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_worker(args)))
        return 0
    trees = {"head": str(HERE.parent)} | dict(v.split("=", 1) for v in args.variant)
    base = [sys.executable, str(Path(__file__).resolve()), "--worker", "--scale", str(args.scale),
            "--hours", str(args.hours), "--queries", str(args.queries)]
    if args.cprofile:
        return subprocess.call([*base, "--cprofile", str(args.cprofile), *(["--request"] if args.request else [])])
    print(f"load average before {os.getloadavg()}")
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in trees}
    for r in range(args.rounds):
        for name, tree in (list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]):
            env = dict(os.environ, PYTHONPATH=tree)
            got = json.loads(subprocess.run(base, env=env, cwd=tree, check=True, capture_output=True,
                                            text=True).stdout.splitlines()[-1])
            rows[name].append(got)
            print(json.dumps({"round": r, "tree": name, **{k: round(v, 1) for k, v in got.items()}}), flush=True)
    print(f"load average after {os.getloadavg()}")
    for name, got in rows.items():
        med = {k: float(np.median([g[k] for g in got])) for k in got[0] if k.endswith("_us")}
        print(f"{name}: median of {len(got)} rounds: " + ", ".join(f"{k[:-3]} {v:.0f} us" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
