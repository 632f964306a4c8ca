"""`metricsd colocation` as a real process against a real `metricsd store` process: a day of
metrics written over gRPC, the plan served over HTTP, printed by `metricsd colocation status`, the
node states kept in the state file; and a bad spec refused with the field named."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from test_consumers_colocation_loop import SPEC, fill

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend

BIN = Path(sys.executable).parent / "metricsd"


class _Batch:
    """Collects the WriteRequests `fill` makes, to send them over gRPC."""

    def __init__(self) -> None:
        self.requests: list[pb.WriteRequest] = []

    def write(self, req: pb.WriteRequest) -> pb.WriteResponse:
        self.requests.append(req)
        return pb.WriteResponse()


async def _send(addr: str, requests: list[pb.WriteRequest]) -> None:
    channel = open_channel(addr)
    backend = GrpcBackend(pb_grpc.MetricsStub(channel))
    try:
        for _ in range(100):
            try:
                await backend.health()
                break
            except Exception:
                await asyncio.sleep(0.2)
        for req in requests:
            resp = await backend.write(req)
            assert not resp.unknown_ids
    finally:
        await channel.close(None)


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as r:
        doc: dict[str, object] = json.load(r)
        return doc


@pytest.mark.slow
def test_the_command_plans_against_a_store_process_and_serves_the_plan(tmp_path: Path,
                                                                     free_ports: Callable[[], int]) -> None:
    grpc_port, http_port = free_ports(), free_ports()
    addr = f"127.0.0.1:{grpc_port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    store = subprocess.Popen([str(BIN), "store", "--host", "127.0.0.1", "--grpc-port", str(grpc_port)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    colo = None
    try:
        # The last sample at the real now, not the minute before: the planner's CPU rate takes a
        # 2 min window over samples a minute apart, so a first decision more than a minute after
        # the newest sample sees no usage at all (it failed that way when the test began late in
        # a minute on a busy machine).
        now = int(time.time() * 1000)
        batch = _Batch()
        fill(batch, now - 26 * 3_600_000, now)  # type: ignore[arg-type]
        asyncio.run(_send(addr, batch.requests))
        spec = tmp_path / "colocation.yaml"
        spec.write_text(json.dumps(SPEC))  # JSON is YAML
        state = tmp_path / "state.json"
        colo = subprocess.Popen([str(BIN), "colocation", "--spec", str(spec), "--addr", addr, "--state", str(state),
                                 "--http-port", str(http_port)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        url = f"http://127.0.0.1:{http_port}"
        doc: dict[str, object] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                doc = _get(f"{url}/api/v1/metricsd/colocation")
                if doc["history"]:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        history = doc.get("history")
        assert isinstance(history, list) and history, "no colocation decision within a minute"
        moves = {(t["node"], t["to"]) for t in history[0]["result"]["transitions"]}
        assert moves == {("n0", "OnlineToOffline"), ("n2", "OnlineToOffline"), ("n3", "OnlineToOffline")}
        assert history[0]["result"]["table"][0]["nodesLendable"] == 3
        with pytest.raises(urllib.error.HTTPError) as missing:
            _get(f"{url}/api/v1/metricsd/hpa")
        assert missing.value.code == 404
        missing.value.close()
        status = subprocess.run([str(BIN), "colocation", "status", "--url", url], capture_output=True, text=True,
                                timeout=30)
        assert status.returncode == 0, status.stderr
        assert "OnlineToOffline" in status.stdout and "Time-share table" in status.stdout
        assert json.loads(state.read_text())["n2"]["phase"] == "OnlineToOffline"
    finally:
        for proc in (colo, store):
            if proc is not None:
                proc.send_signal(signal.SIGINT)
        outs = [p.communicate(timeout=20)[0] for p in (colo, store) if p is not None]
    assert colo is not None and colo.returncode == 0, outs[0]


@pytest.mark.slow
def test_a_bad_spec_is_refused_naming_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("kind: ColocationPlan\nspec:\n  pools: [{name: a, nodes: [n1]}]\n  minLendMinutes: soon\n")
    r = subprocess.run([str(BIN), "colocation", "--spec", str(spec), "--addr", "127.0.0.1:1", "--once"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "documents[0].spec.minLendMinutes: must be a number or quantity, got 'soon'" in r.stderr


@pytest.mark.slow
def test_the_status_port_is_refused_off_loopback_without_tls_and_tokens(tmp_path: Path) -> None:
    spec = tmp_path / "colocation.yaml"
    spec.write_text(json.dumps(SPEC))
    r = subprocess.run([str(BIN), "colocation", "--spec", str(spec), "--addr", "127.0.0.1:1", "--http-port", "7410",
                        "--http-host", "10.0.0.1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert "--http-port would listen on 10.0.0.1 without TLS" in r.stderr and "--insecure" in r.stderr


@pytest.mark.slow
def test_the_status_port_serves_tls_and_wants_a_read_token(tmp_path: Path, free_ports: Callable[[], int]) -> None:
    import ssl

    from metricsd.security.certs import create_local_pki
    from metricsd.security.tokens import hash_token

    pki = create_local_pki(tmp_path / "pki")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\nagent write {hash_token('w')}\n")
    spec = tmp_path / "colocation.yaml"
    spec.write_text(json.dumps(SPEC))
    port = free_ports()
    colo = subprocess.Popen([str(BIN), "colocation", "--spec", str(spec), "--addr", "127.0.0.1:1",
                             "--http-port", str(port), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
                             "--tokens-file", str(tokens)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    url = f"https://127.0.0.1:{port}/api/v1/metricsd/colocation"

    def get(token: str | None) -> int:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            e.close()
            return int(e.code)

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                code = get(None)
                break
            except OSError:
                assert time.monotonic() < deadline, "the status port never answered"
                time.sleep(0.2)
        assert code == 401
        assert get("w") == 403  # a write token may not read
        assert get("r") == 200
        with pytest.raises(OSError):  # plaintext HTTP gets no answer from a TLS port
            urllib.request.urlopen(url.replace("https", "http"), timeout=5)
    finally:
        colo.send_signal(signal.SIGINT)
        out = colo.communicate(timeout=20)[0]
    assert "status on https://" in out, out
