"""`metricsd agent` in-process: flags, a few passes over a fixture tree or the simulator on a
ManualClock into an in-process store, and the /metrics and /healthz endpoints."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from cgroup_fixture_tree import PODS_JSON, build_proc, build_tree, standard_pods
from prometheus_client import CollectorRegistry

from metricsd.agent.buffer import PushBuffer
from metricsd.agent.pusher import Pusher
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.agent.telemetry import AgentExporter, LoopStats, health, start_http
from metricsd.clock import ManualClock
from metricsd.cmd.agent import AgentOptions, add_arguments, add_parser, options_from_args, run_agent
from metricsd.model import is_stale
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable
from metricsd.selector import parse_selector
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

T0 = 1_714_550_400_000


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def fake_sleep(clock: ManualClock) -> Callable[[float], Awaitable[None]]:
    async def sleep(seconds: float) -> None:
        clock.advance(max(1, math.ceil(seconds * 1000)))
        # Idle a moment for real: the collector runs in a worker thread, and a loop whose sleeps
        # never block keeps the GIL from it (one pass then took minutes under the 5 ms switch interval).
        await asyncio.sleep(0.0005)

    return sleep


def test_flags_become_options() -> None:
    opts = options_from_args(parse("--targets", "10.0.0.1:7401, 10.0.0.2:7401", "--interval", "15s",
                                   "--node-name", "worker-1", "--buffer-bytes", "64Mi", "--buffer-dir", "/tmp/x"))
    assert opts.targets == ("10.0.0.1:7401", "10.0.0.2:7401")
    assert (opts.interval_ms, opts.node_name, opts.buffer_bytes) == (15_000, "worker-1", 64 << 20)
    assert opts.buffer_dir == Path("/tmp/x") and not opts.simulate
    sim = options_from_args(parse("--simulate", "--pods", "7", "--workloads", "2", "--nodes", "3", "--seed", "4",
                                  "--backfill", "7d", "--interval", "1s"))
    assert sim.sim == SimConfig(pods=7, workloads=2, nodes=3, seed=4, interval_ms=1000, cluster="sim")
    assert sim.backfill_ms == 7 * 86_400_000
    assert options_from_args(parse("--metrics-port", "-1")).metrics_port is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--interval", "500ms"], "--interval must be at least 1s, got 500 ms"),
        (["--targets", "nohost"], "--targets: 'nohost' is not host:port"),
        (["--targets", "a:99999"], "--targets: 'a:99999' is not host:port"),
        (["--backfill", "1h"], "--backfill needs --simulate"),
    ],
)
def test_bad_flags_are_explained(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as e:
        options_from_args(parse(*argv))
    assert str(e.value) == message


def test_the_subcommand_registers_under_a_parent_parser() -> None:
    parser = argparse.ArgumentParser(prog="metricsd")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["agent", "--simulate", "--pods", "3"])
    assert args.command == "agent" and args.simulate and args.pods == 3


async def test_passes_over_a_fixture_tree_reach_the_store(tmp_path: Path) -> None:
    build_tree(tmp_path / "cgroup", "systemd", standard_pods())
    build_proc(tmp_path / "proc")
    opts = options_from_args(parse("--node-name", "worker-1", "--cgroup-root", str(tmp_path / "cgroup"),
                                   "--proc-root", str(tmp_path / "proc"), "--pods-file", str(PODS_JSON),
                                   "--interval", "10s", "--metrics-port", "-1", "--buffer-dir",
                                   str(tmp_path / "spool")))
    clock, store = ManualClock(T0), Store()
    summary = await run_agent(opts, clock=clock, sleep=fake_sleep(clock),
                              backends=[("local", LocalBackend(StoreAPI(store)))], max_passes=3)
    assert summary["passes"] == 3 and summary["buffered_samples"] == 0 and summary["dropped_samples"] == 0
    assert summary["sent_samples"] == summary["collected_samples"] > 0
    cpu = store.read(parse_selector('pod="web-7d4b9c8f6d-x2x9p",container="app"',
                                    metric="container_cpu_usage_seconds_total"), 0, 2**62)
    assert len(cpu) == 1
    assert cpu[0].timestamps.tolist() == [T0, T0 + 10_000, T0 + 20_000]
    assert cpu[0].values.tolist() == [12.5, 12.5, 12.5]
    node = store.read(parse_selector('pod="node-worker-1"', metric="kube_node_status_capacity"), 0, 2**62)
    assert {dict(s.labels)["resource"]: s.values[-1] for s in node} == {"cpu": 4.0, "memory": 16_384_000 * 1024}


async def test_a_pod_that_goes_away_ends_with_a_stale_marker_in_the_store(tmp_path: Path) -> None:
    import shutil

    from cgroup_fixture_tree import DB_UID, pod_dir

    build_proc(tmp_path / "proc")
    # The pod is removed while the agent sleeps after its first pass.
    clock2, store2 = ManualClock(T0), Store()
    build_tree(tmp_path / "cgroup2", "cgroupfs", standard_pods())
    opts2 = options_from_args(parse("--node-name", "worker-1", "--cgroup-root", str(tmp_path / "cgroup2"),
                                    "--proc-root", str(tmp_path / "proc"), "--pods-file", str(PODS_JSON),
                                    "--metrics-port", "-1"))

    async def sleep_and_remove(seconds: float) -> None:
        shutil.rmtree(pod_dir(tmp_path / "cgroup2", "cgroupfs", DB_UID, "guaranteed"), ignore_errors=True)
        clock2.advance(max(1, math.ceil(seconds * 1000)))
        await asyncio.sleep(0.0005)  # idle for real, so the collector's worker thread gets the GIL

    await run_agent(opts2, clock=clock2, sleep=sleep_and_remove,
                    backends=[("local", LocalBackend(StoreAPI(store2)))], max_passes=2)
    (db2,) = store2.read(parse_selector('pod="db-0"', metric="container_cpu_usage_seconds_total"), 0, 2**62)
    assert db2.timestamps.tolist() == [T0, T0 + 10_000]
    assert db2.values[0] == 3600.0 and is_stale(float(db2.values[1]))


async def test_the_simulator_backfills_then_ticks_through_the_same_pusher() -> None:
    opts = options_from_args(parse("--simulate", "--pods", "4", "--workloads", "2", "--nodes", "1", "--seed", "3",
                                   "--interval", "10s", "--backfill", "10m", "--metrics-port", "-1"))
    clock, store = ManualClock(T0 + 5_000), Store()
    summary = await run_agent(opts, clock=clock, sleep=fake_sleep(clock),
                              backends=[("local", LocalBackend(StoreAPI(store)))], max_passes=63)
    assert opts.sim is not None
    reference = Simulator(opts.sim, T0 + 5_000 - 600_000)
    stamps, values = reference.block(63)
    assert summary["sent_samples"] == values.size == summary["collected_samples"]
    got = {s.id: s for s in store.read(parse_selector("", metric="container_memory_rss"), 0, 2**62)}
    cols = reference.columns("container_memory_rss")
    for j, sid in enumerate(reference.series_ids[cols].tolist()):
        assert got[sid].timestamps.tolist() == stamps.tolist()
        np.testing.assert_array_equal(got[sid].values, values[:, cols][:, j])


async def test_metrics_and_healthz_are_served(port: int) -> None:
    clock = ManualClock(T0)
    store = Store()
    pusher = Pusher(PushBuffer(), [("local:7401", LocalBackend(StoreAPI(store)))], clock)
    stats = LoopStats(interval_ms=10_000, started_ms=T0, passes=2, last_pass_ms=T0)
    registry = CollectorRegistry()
    registry.register(AgentExporter(pusher, stats))
    pusher.stats.delay.observe(0.02)
    pusher.stats.failures["local:7401"] += 2
    runner, bound = await start_http("127.0.0.1", port, registry, lambda: health(stats, pusher, clock))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{bound}/metrics") as resp:
                text = await resp.text()
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
            assert 'metricsd_agent_collection_delay_seconds_bucket{le="0.025"} 1.0' in text
            assert 'metricsd_agent_write_failures_total{target="local:7401"} 2.0' in text
            assert "metricsd_agent_buffer_dropped_batches_total 0.0" in text
            async with http.get(f"http://127.0.0.1:{bound}/healthz") as resp:
                assert resp.status == 200 and json.loads(await resp.text())["status"] == "ok"
            clock.advance(31_000)  # no pass for more than three intervals: stalled
            async with http.get(f"http://127.0.0.1:{bound}/healthz") as resp:
                body = json.loads(await resp.text())
                assert resp.status == 503 and body["status"] == "stalled" and body["last_pass_age_s"] == 31.0
    finally:
        await runner.cleanup()


def test_default_options_are_the_documented_ones() -> None:
    opts = AgentOptions()
    assert opts.targets == ("127.0.0.1:7401",) and opts.interval_ms == 10_000
    assert opts.cgroup_root == Path("/sys/fs/cgroup") and opts.buffer_dir is None


class DownBackend(LocalBackend):
    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        raise Unavailable("Write: UNAVAILABLE: connection refused")


async def test_what_an_outage_left_undelivered_is_sent_after_an_agent_restart(tmp_path: Path) -> None:
    build_tree(tmp_path / "cgroup", "systemd", standard_pods())
    build_proc(tmp_path / "proc")
    opts = dataclasses.replace(
        options_from_args(parse("--node-name", "worker-1", "--cgroup-root", str(tmp_path / "cgroup"),
                                "--proc-root", str(tmp_path / "proc"), "--pods-file", str(PODS_JSON),
                                "--metrics-port", "-1", "--buffer-dir", str(tmp_path / "spool"))),
        shutdown_flush_s=0.05)
    clock, store = ManualClock(T0), Store()
    down = await run_agent(opts, clock=clock, sleep=fake_sleep(clock),
                           backends=[("local", DownBackend(StoreAPI(store)))], max_passes=3)
    assert down["sent_samples"] == 0 and down["buffered_samples"] == down["collected_samples"] > 0
    assert any(tmp_path.joinpath("spool").iterdir()), "the undelivered batches are spooled"
    up = await run_agent(opts, clock=clock, sleep=fake_sleep(clock),
                         backends=[("local", LocalBackend(StoreAPI(store)))], max_passes=1)
    assert up["replayed_samples"] == down["collected_samples"]
    assert up["buffered_samples"] == 0 and up["dropped_samples"] == 0
    (cpu,) = store.read(parse_selector('pod="web-7d4b9c8f6d-x2x9p",container="app"',
                                       metric="container_cpu_usage_seconds_total"), 0, 2**62)
    assert len(cpu.timestamps) == 4, "three passes from before the restart and one after"
    assert bool(np.all(np.diff(cpu.timestamps) > 0))
