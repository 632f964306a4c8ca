"""A real `metricsd up --remote-write-url --data-dir` killed with SIGKILL while its receiver (a real
VictoriaMetrics) is down, started again on the same directory: it resumes from its onward buffer
and every sample written through it reaches VictoriaMetrics, none missing and none that was not
written. A kill may send the last second's requests again (the cursor's file is written when the
sender catches up, at most once a second while it has not: sender.py); VictoriaMetrics, without
deduplication, would keep such a sample twice, so the check is on the distinct samples."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import grpc
import pytest
from onward_peers import VICTORIA_METRICS, free_port, metric_values, running, victoria_metrics, vm_flush, wait_for
from processes import stop_process

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.client import GrpcBackend

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VICTORIA_METRICS is None, reason="victoria-metrics is not installed: run `make "
                                                        "victoria-metrics-deps` (apt-get, as root)"),
]


def _up(data: Path, http: int, grpc_port: int, target: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "metricsd", "up", "--no-simulate", "--no-consumers", "--host",
                                 "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port), "--data-dir",
                                 str(data), "--remote-write-url", target],
                                stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"})


def _onward(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {name: sum(metric_values(text, f"metricsd_onward_{name}").values()) for name in
            ("samples_sent_total", "samples_pending", "samples_queued_total")}


async def _write(addr: str, sim: Simulator, ticks: int) -> set[tuple[str, int]]:
    """``ticks`` ticks of the simulated pods through gRPC Write; returns (series key, ts) written."""
    channel = grpc.aio.insecure_channel(addr)
    backend = GrpcBackend(pb_grpc.MetricsStub(channel), timeout_s=30)
    labels = {sid: lab for sid, lab in zip(sim.series_ids.tolist(), sim.series, strict=True)}
    out: set[tuple[str, int]] = set()
    try:
        for _ in range(ticks):
            ts, values = sim.next_tick()
            for req in write_requests(sim, ts, values, max_samples=2_000, send_labels_for=None):
                resp = await backend.write(req)
                assert not resp.unknown_ids and resp.samples_written == len(req.timestamps)
                at = 0
                for sid, n in zip(req.ids, req.counts, strict=True):
                    key = json.dumps(dict(labels[sid]), sort_keys=True)
                    out.update((key, t) for t in req.timestamps[at:at + n])
                    at += n
    finally:
        await channel.close()
    return out


def _in_vm(url: str) -> list[tuple[str, int]]:
    """Every raw sample VictoriaMetrics holds (duplicates kept), as (series key, ts)."""
    params = urllib.parse.urlencode({"match[]": '{__name__=~".+"}', "start": "0"})
    with urllib.request.urlopen(f"{url}/api/v1/export?{params}", timeout=30) as r:
        lines = r.read().decode().splitlines()
    out = []
    for line in lines:
        row = json.loads(line)
        key = json.dumps(row["metric"], sort_keys=True)
        out += [(key, int(t)) for t in row["timestamps"]]
    return out


def test_a_killed_metricsd_resumes_from_its_buffer_and_every_sample_arrives(tmp_path: Path) -> None:
    vm = victoria_metrics(tmp_path / "vm")
    http, grpc_port = free_port(), free_port()
    url, addr = f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc_port}"
    log = tmp_path / "up.log"
    sim = Simulator(SimConfig(pods=10), int(time.time() * 1000) - 20 * 60_000)
    with running(vm):
        proc = _up(tmp_path / "data", http, grpc_port, vm.url + "/api/v1/write", log)
        try:
            wait_for("metricsd up", lambda: _onward(url), [log], 120)
            written = asyncio.run(_write(addr, sim, 3))
            wait_for("three ticks sent", lambda: _onward(url)["samples_sent_total"] == len(written), [log], 60)
            vm.stop()
            more = asyncio.run(_write(addr, sim, 4))  # queued while the receiver is down
            wait_for("retrying", lambda: _onward(url)["samples_pending"] == len(more) or None, [log], 30)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            vm.start()
            proc = _up(tmp_path / "data", http, grpc_port, vm.url + "/api/v1/write", log)
            wait_for("the backlog sent after the restart", lambda: (
                (m := _onward(url))["samples_sent_total"] >= len(more) and m["samples_pending"] == 0), [log], 120)
            written |= more
            written |= asyncio.run(_write(addr, sim, 1))  # and live again
            wait_for("caught up", lambda: _onward(url)["samples_pending"] == 0, [log], 60)
            vm_flush(vm)
            seen: list[int] = []

            def arrived() -> list[tuple[str, int]] | None:
                g = _in_vm(vm.url)
                seen[:] = [len(g), len(set(g)), len(set(g) & written), len(written)]
                return g if len(set(g)) >= len(written) else None

            try:
                got = wait_for("every sample in VictoriaMetrics", arrived, [vm.log, log], 30)
            except AssertionError:
                raise AssertionError(f"in VictoriaMetrics, distinct, of them written, written: {seen}") from None
            assert set(got) == written  # none lost, none that was not written
            assert len(got) - len(set(got)) <= len(more)  # at most the resent requests twice
        finally:
            stop_process(proc)
