"""What TLS and tokens cost: one store process with and without them, side by side in one run
(a documented command, not a test).

    .venv/bin/python perf/bench_tls.py            # 2 rounds each, alternating
    .venv/bin/python perf/bench_tls.py --rounds 1

Each round starts a fresh `metricsd up --no-simulate` process, plaintext or with mutual TLS and a
token file (a throw-away CA from metricsd/security/certs.py), and measures with the same client
code as perf/bench_store.py: ingest in the backfill shape (1,000 series x 60 samples a request)
and the agents' live shape (1,000 series x 1 sample a request) as server CPU seconds per million
samples, and the 5,000-pod aggregate's latency at concurrency 1. Rounds alternate so that a
noisy neighbour hurts both sides alike. Writes perf/results/bench_tls.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_store import BIN, HERE, StoreProcess, _agg_request, ingest, latency

from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.rpc.client import MetricsClient
from metricsd.security.certs import create_local_pki
from metricsd.security.settings import ClientSecurity
from metricsd.security.tls import ClientTLS
from metricsd.security.tokens import hash_token, new_token


def _command(secure: bool, pki_dir: Path, tokens: Path) -> object:
    def command(port: int) -> list[str]:
        cmd = [str(BIN), "--log-level", "WARNING", "up", "--no-simulate", "--no-consumers", "--grpc-port", str(port),
               "--http-port", "0"]
        if secure:
            cmd += ["--tls-cert", str(pki_dir / "metricsd.crt"), "--tls-key", str(pki_dir / "metricsd.key"),
                    "--tls-client-ca", str(pki_dir / "ca.crt"), "--tokens-file", str(tokens)]
        return cmd

    return command


async def one_round(secure: bool, pki_dir: Path, tokens: Path, token: str, args: argparse.Namespace
                    ) -> dict[str, object]:
    security = ClientSecurity(ClientTLS(pki_dir / "ca.crt", pki_dir / "metricsd.crt", pki_dir / "metricsd.key"),
                              token) if secure else None
    store = StoreProcess(_command(secure, pki_dir, tokens))  # type: ignore[arg-type]
    try:
        async with MetricsClient(store.addr, timeout_s=60, security=security) as client:
            await store.wait_ready(client)
            sim = Simulator(SimConfig(pods=args.pods, workloads=50, nodes=max(5, args.pods // 50), seed=1),
                            1_700_000_000_000)
            backfill = await ingest(client, store.proc.pid, sim, args.ticks, 60, 1000, first=True)
            live = await ingest(client, store.proc.pid, sim, args.live_ticks, 1, 1000, first=False)
        store.stop()
        store = StoreProcess(_command(secure, pki_dir, tokens))  # type: ignore[arg-type]
        async with MetricsClient(store.addr, timeout_s=60, security=security) as client:
            await store.wait_ready(client)
            sim = Simulator(SimConfig(pods=10_000, workloads=101, nodes=100, seed=2, big_workload_pods=5000),
                            1_700_000_000_000)
            await ingest(client, store.proc.pid, sim, 30, 30, 1000, first=True)
            at = sim.next_timestamp_ms - 1
            agg = await latency(client, _agg_request(False, at), args.queries, 1)
    finally:
        if store.proc.poll() is None:
            store.stop()
    return {"backfill_cpu_s_per_million": backfill["server_cpu_s_per_million"],
            "live_cpu_s_per_million": live["server_cpu_s_per_million"],
            "aggregate_c1_p50_ms": agg["p50_ms"], "aggregate_c1_p99_ms": agg["p99_ms"]}


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="metricsd-bench-tls-") as d:
        pki_dir = Path(d) / "pki"
        create_local_pki(pki_dir)
        token = new_token()
        tokens = Path(d) / "tokens"
        tokens.write_text(f"bench admin {hash_token(token)}\n")
        runs: dict[str, list[dict[str, object]]] = {"plaintext": [], "tls_tokens": []}
        for _ in range(args.rounds):
            for secure in (False, True):
                runs["tls_tokens" if secure else "plaintext"].append(
                    await one_round(secure, pki_dir, tokens, token, args))
    summary = {side: {k: float(np.median([float(r[k]) for r in rs])) for k in rs[0]} for side, rs in runs.items()}  # type: ignore[arg-type]
    return {"command": " ".join([".venv/bin/python", "perf/bench_tls.py", *sys.argv[1:]]), "cores": os.cpu_count(),
            "python": platform.python_version(), "rounds": runs, "median": summary}


def markdown(r: dict) -> str:
    p, t = r["median"]["plaintext"], r["median"]["tls_tokens"]
    rows = ["| measure (median of rounds) | plaintext | mutual TLS + token | cost |", "| --- | --- | --- | --- |"]
    for key, name, unit in (("backfill_cpu_s_per_million", "ingest, backfill shape, server CPU s per million", ""),
                            ("live_cpu_s_per_million", "ingest, live shape, server CPU s per million", ""),
                            ("aggregate_c1_p50_ms", "aggregate over 5,000 pods, concurrency 1, p50", " ms"),
                            ("aggregate_c1_p99_ms", "same, p99", " ms")):
        rows.append(f"| {name} | {p[key]:.2f}{unit} | {t[key]:.2f}{unit} | {t[key] - p[key]:+.2f}{unit} "
                    f"({(t[key] / p[key] - 1) * 100:+.0f}%) |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--pods", type=int, default=1250, help="pods for the ingest part (8 series each)")
    p.add_argument("--ticks", type=int, default=360, help="backfill ticks (10 s each)")
    p.add_argument("--live-ticks", type=int, default=30)
    p.add_argument("--queries", type=int, default=100)
    args = p.parse_args()
    r = asyncio.run(main_async(args))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_tls.json").write_text(json.dumps(r, indent=2))
    print(f"command: {r['command']}  (cores: {r['cores']}, Python {r['python']})")
    print(markdown(r))


if __name__ == "__main__":
    main()
