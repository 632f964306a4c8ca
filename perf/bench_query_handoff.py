"""(b) on the HTTP hot path against (b) on a connection handed to aiohttp (issue 23): servers'
CPU per question, arms interleaved in one run.

metricsd/http/hotpath.py answers ``/api/v1/query`` and ``/api/v1/query_range`` below aiohttp's
web layer, but a connection that asks any other route once is handed to aiohttp for good. Each
system given is asked (b), ``rate()`` of one pod's CPU counter over 1 h at a 30 s step, on two
client sessions: ``hot`` (only the query route) and ``handed`` (each of its pooled connections
asked ``/api/v1/metricsd/stats`` first). The figure is each listed process's CPU per question
(/proc/<pid>/schedstat, ns), arm by arm, rounds alternating the order.

Point it at running servers fed with perf/compare_workload.py's pods, e.g. those of
``perf/bench_reads.py --idle 600`` while it idles (their ports and pids from ``ps``):

    .venv/bin/python perf/bench_query_handoff.py --system cluster=PROXY_HTTP_PORT:PID,PID,... \\
        --system one=HTTP_PORT:PID --queries 600 --rounds 8 --concurrency 1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


async def run(args: argparse.Namespace) -> None:
    c = args.concurrency
    at = int(time.time() * 1000) // 10_000 * 10_000 - 60_000
    arms: dict[tuple[str, str], tuple[aiohttp.ClientSession, str, dict[str, str], list[int]]] = {}
    for spec in args.system:
        name, _, rest = spec.partition("=")
        port, _, pids = rest.partition(":")
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s0, s0.get(url + "/api/v1/label/pod/values") as r:
            pod = sorted((await r.json())["data"])[0]
        params = {"query": f'rate(container_cpu_usage_seconds_total{{pod="{pod}"}}[1m])',
                  "start": str((at - 3_600_000) / 1000), "end": str(at / 1000), "step": "30"}
        for arm in ("hot", "handed"):
            s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c))
            if arm == "handed":  # each of the c pooled connections asks another route once

                async def stats(s: aiohttp.ClientSession = s, url: str = url) -> None:
                    async with s.get(url + "/api/v1/metricsd/stats") as r:
                        await r.read()
                await asyncio.gather(*(stats() for _ in range(c)))
            arms[(name, arm)] = (s, url, params, [int(p) for p in pids.split(",")])
    rows: dict[tuple[str, str], list[tuple[float, dict[int, float]]]] = {k: [] for k in arms}
    per = args.queries // c
    for rnd in range(args.rounds):
        for key in list(arms) if rnd % 2 == 0 else list(arms)[::-1]:
            s, url, params, pids = arms[key]

            async def ask(k: int, s: aiohttp.ClientSession = s, url: str = url,
                          params: dict[str, str] = params) -> None:
                for _ in range(k):
                    async with s.get(url + "/api/v1/query_range", params=params) as r:
                        await r.read()
            await asyncio.gather(*(ask(20 // c + 1) for _ in range(c)))  # warm
            before = {p: cpu_ns(p) for p in pids}
            t = time.perf_counter()
            await asyncio.gather(*(ask(per) for _ in range(c)))
            n = per * c
            rows[key].append(((time.perf_counter() - t) / n * 1e3,
                              {p: (cpu_ns(p) - before[p]) / n / 1e6 for p in pids}))
    for (name, arm), got in rows.items():
        totals = [sum(a.values()) for _, a in got]
        pids_ms = " ".join(f"{p}:{statistics.median(a[p] for _, a in got):.3f}" for p in got[0][1])
        print(f"{name:8s} {arm:7s} c{c} wall/q {statistics.median(w for w, _ in got):.3f} ms  "
              f"cpu/q median {statistics.median(totals):.3f} ms (rounds {' '.join(f'{x:.3f}' for x in totals)})"
              f"  per pid {pids_ms}", flush=True)
    for s, *_ in arms.values():
        await s.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", action="append", required=True, metavar="NAME=PORT:PID[,PID...]")
    p.add_argument("--queries", type=int, default=600)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=1)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
