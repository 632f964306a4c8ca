"""A real agent against a real `metricsd up`, with the store frozen for 30 s in the middle.

SIGSTOP rather than a kill: the store keeps its data in memory, so a kill would lose what was
stored before the outage; from the agent's side a frozen store is an outage all the same (its
writes time out). After SIGCONT every sample the agent produced, including the 30 s of the
outage, must be in the store, with the values the simulator gives for those ticks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc

METRICSD = Path(sys.executable).parent / "metricsd"
OUTAGE_S = 30.0
SIM = SimConfig(pods=4, workloads=2, nodes=1, seed=5, interval_ms=1000)


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, grpc.RpcError, ValueError):
            pass
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def read_all(stub: pb_grpc.MetricsStub) -> dict[int, tuple[list[int], list[float]]]:
    req = pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.EQ, name="cluster", value=SIM.cluster)],
                         start_ms=0, end_ms=2**62)
    resp = stub.Read(req, timeout=10)
    return {s.id: (list(s.timestamps), list(s.values)) for s in resp.series}


def healthz(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
        body: dict[str, object] = json.loads(r.read())
        return body


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait(10)


def start(argv: list[str], log: Path, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    procs.append(p)
    return p


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_30_second_store_outage_loses_nothing(
    tmp_path: Path, free_ports: Callable[[], int], processes: list[subprocess.Popen[bytes]]
) -> None:
    grpc_port, metrics_port, http_port = free_ports(), free_ports(), free_ports()
    store = start([str(METRICSD), "up", "--no-simulate", "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
                  tmp_path / "store.log", processes)  # its own HTTP port: the default one may be taken
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = pb_grpc.MetricsStub(channel)
    wait_for("the store", lambda: stub.Health(pb.HealthRequest(), timeout=1).status == pb.HealthResponse.SERVING,
             30)

    agent_log = tmp_path / "agent.log"
    agent = start(
        [sys.executable, "-m", "metricsd", "agent", "--targets", f"127.0.0.1:{grpc_port}", "--simulate",
         "--pods", str(SIM.pods), "--workloads", str(SIM.workloads), "--nodes", str(SIM.nodes),
         "--seed", str(SIM.seed), "--interval", "1s", "--write-timeout", "2s", "--metrics-port", str(metrics_port),
         "--buffer-dir", str(tmp_path / "spool")],
        agent_log, processes)
    wait_for("samples before the outage", lambda: sum(len(t) for t, _ in read_all(stub).values()) > 100, 30)

    os.kill(store.pid, signal.SIGSTOP)
    stopped_ms = time.time() * 1000
    time.sleep(OUTAGE_S)  # a real outage: the agent's real timers must run through it
    assert agent.poll() is None, "the agent keeps running through the outage"
    assert healthz(metrics_port)["buffered_batches"] >= 25  # type: ignore[operator]
    os.kill(store.pid, signal.SIGCONT)
    resumed_ms = time.time() * 1000

    wait_for("the agent to drain its buffer",
             lambda: healthz(metrics_port)["buffered_batches"] == 0
             and healthz(metrics_port)["targets"] == {f"127.0.0.1:{grpc_port}": "up"}, 60)
    wait_for("a tick collected after the outage to be stored",
             lambda: max((t[-1] for t, _ in read_all(stub).values() if t), default=0) > resumed_ms + 1000, 30)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(30) == 0
    log = agent_log.read_text()
    summary = json.loads(log.rsplit("agent stopped: ", 1)[1].splitlines()[0])
    assert summary["dropped_samples"] == 0 and summary["buffered_samples"] == 0, log[-2000:]
    assert summary["sent_samples"] == summary["collected_samples"]
    assert "target 127.0.0.1:" in log and "is back after" in log

    stored = read_all(stub)
    channel.close()
    # Counts: everything the agent produced is stored, no more and no less.
    assert sum(len(t) for t, _ in stored.values()) == summary["collected_samples"]
    # Values: the ticks are contiguous and equal to what the simulator gives for them.
    first = min(t[0] for t, _ in stored.values())
    ticks = summary["collected_samples"] // len(stored)
    reference = Simulator(SIM, first)
    stamps, values = reference.block(ticks)
    assert stamps[0] < stopped_ms and stamps[-1] > resumed_ms + 1000
    during = int(np.sum((stamps >= stopped_ms) & (stamps <= resumed_ms)))
    assert during >= OUTAGE_S - 2, f"only {during} ticks fell in the outage"
    assert set(stored) == set(reference.series_ids.tolist())
    for j, sid in enumerate(reference.series_ids.tolist()):
        ts, vs = stored[sid]
        assert ts == stamps.tolist(), f"series {j}: timestamps differ"
        np.testing.assert_array_equal(np.array(vs), values[:, j])
