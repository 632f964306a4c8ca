"""A sender against a real HTTP(S) server on 127.0.0.1 that answers what the test says (a real
VictoriaMetrics or Prometheus does not answer 503 or 429 on demand): the retry policy (5xx and 429
retried with back-off, the same body again; another 4xx not retried, its samples counted as
failed, the next batch sent), and TLS with a CA file and a bearer token or basic auth read from
their files."""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path

import pytest
from aiohttp import web
from onward_peers import free_port
from prometheus_client import CollectorRegistry

from metricsd.clock import ManualClock
from metricsd.cmd.localsecurity import LocalSecurity
from metricsd.model import make_labels, series_id
from metricsd.onward.target import parse_targets
from metricsd.onward.tee import Onward
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb

NOW = 1_800_000_000_000


class Receiver:
    """Answers request i with ``statuses[i]`` (204 past the end); keeps each request's body and headers."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.got: list[tuple[bytes, dict[str, str]]] = []

    async def write(self, request: web.Request) -> web.Response:
        i = len(self.got)
        self.got.append((await request.read(), dict(request.headers)))
        status = self.statuses[i] if i < len(self.statuses) else 204
        return web.Response(status=status, text=None if status == 204 else f"answer {status}")

    async def serve(self, ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.router.add_post("/api/v1/write", self.write)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
        return runner, port


def _batch(t: int, pods: range) -> pb.WriteRequest:
    labels = [make_labels("m", {"namespace": "ns", "pod": f"p{i}"}) for i in pods]
    req = pb.WriteRequest(ids=[series_id(lab) for lab in labels], counts=[1] * len(labels),
                          timestamps=[t] * len(labels), values=[float(t % 1000)] * len(labels))
    for lab in labels:
        req.series.add(id=series_id(lab)).labels.extend(labels_to_pb(lab))
    return req


async def _drain(onward: Onward, name: str) -> None:
    for _ in range(400):
        if not onward.buffer.pending(name):
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{onward.buffer.pending(name)} samples still pending")


def _onward(tmp_path: Path, config: str, slept: list[float]) -> Onward:
    async def sleep(s: float) -> None:  # the back-off, recorded, not waited for
        slept.append(s)

    return Onward(tmp_path / "onward", parse_targets([], config), CollectorRegistry(), ManualClock(NOW), sleep=sleep,
                  rand=lambda: 0.5)


@pytest.mark.parametrize("retry_429", [True, False])
async def test_5xx_and_429_are_retried_with_the_same_body_and_another_4xx_is_not(tmp_path: Path,
                                                                                  retry_429: bool) -> None:
    rx = Receiver([503, 429, 204, 400, 204] if retry_429 else [429, 204])
    runner, port = await rx.serve()
    slept: list[float] = []
    onward = _onward(tmp_path, f"""
- url: http://127.0.0.1:{port}/api/v1/write
  name: rx
  protocol: "1.0"
  queue_config: {{shards: 1, max_samples_per_send: 10, min_backoff: 1s, max_backoff: 8s,
                 retry_on_http_429: {str(retry_429).lower()}}}
""", slept)
    m = onward.metrics
    try:
        onward.start()
        for k in range(3 if retry_429 else 2):  # a batch a round: 10 samples, one request
            onward.queue(_batch(NOW + k * 10_000, range(10)))
            await _drain(onward, "rx")
        codes = {s.labels["code"]: s.value for s in m.requests.collect()[0].samples if s.name.endswith("_total")}
        if retry_429:
            bodies = [b for b, _ in rx.got]
            assert bodies[0] == bodies[1] == bodies[2] and len(set(bodies)) == 3  # the first again; then two more
            assert slept == [0.75, 1.5]  # exponential back-off from 1 s (jitter 0.5, rand 0.5: x 0.75)
            assert codes == {"503": 1, "429": 1, "204": 2, "400": 1}
            assert (m.sent.labels("rx")._value.get(), m.failed.labels("rx")._value.get(),
                    m.retries.labels("rx")._value.get()) == (20, 10, 2)
        else:
            assert len(rx.got) == 2 and rx.got[0][0] != rx.got[1][0] and slept == []
            assert (m.sent.labels("rx")._value.get(), m.failed.labels("rx")._value.get()) == (10, 10)
        assert all(h["Content-Encoding"] == "snappy" and h["X-Prometheus-Remote-Write-Version"] == "0.1.0"
                   for _, h in rx.got)
    finally:
        await onward.close()
        await runner.cleanup()


@pytest.mark.parametrize("auth", ["bearer", "basic"])
async def test_tls_with_a_ca_file_and_the_secret_read_from_its_file(tmp_path: Path, auth: str) -> None:
    sec = LocalSecurity(tmp_path / "sec").create()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(sec.cert, sec.key)
    rx = Receiver([])
    runner, port = await rx.serve(server_tls)
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    how = f"bearer_token_file: {secret}" if auth == "bearer" else \
        f"basic_auth: {{username: metricsd, password_file: {secret}}}"
    good, untrusted = (f"""
- url: https://127.0.0.1:{port}/api/v1/write
  name: {name}
  protocol: "1.0"
  {how}
  {tls}
  queue_config: {{shards: 1, min_backoff: 1s, max_backoff: 1s}}
""" for name, tls in (("tls", f"tls_config: {{ca_file: {sec.ca}, server_name: localhost}}"), ("no-ca", "")))
    slept: list[float] = []
    onward = _onward(tmp_path / "a", good, slept)
    try:
        onward.start()
        onward.queue(_batch(NOW, range(5)))
        await _drain(onward, "tls")
        want = "Bearer s3cret" if auth == "bearer" else "Basic " + base64.b64encode(b"metricsd:s3cret").decode()
        assert len(rx.got) == 1 and rx.got[0][1]["Authorization"] == want and slept == []
        secret.write_text("rotated\n")  # read again for each request
        onward.queue(_batch(NOW + 10_000, range(5)))
        await _drain(onward, "tls")
        assert rx.got[1][1]["Authorization"].endswith("rotated" if auth == "bearer" else
                                                      base64.b64encode(b"metricsd:rotated").decode())
    finally:
        await onward.close()
    # Without the CA the server's certificate is not trusted: nothing reaches it, the sender retries.
    bare = _onward(tmp_path / "b", untrusted, slept)
    try:
        bare.start()
        bare.queue(_batch(NOW, range(5)))
        for _ in range(200):
            if len(slept) >= 2:
                break
            await asyncio.sleep(0.025)
        assert len(slept) >= 2 and len(rx.got) == 2 and bare.buffer.pending("no-ca") == 5
        codes = {s.labels["code"] for s in bare.metrics.requests.collect()[0].samples if s.name.endswith("_total")}
        assert codes == {"error"}
    finally:
        await bare.close()
        await runner.cleanup()


async def test_protocol_auto_sends_2_0_to_a_receiver_that_says_so_and_falls_back_to_1_0_on_415(
        tmp_path: Path) -> None:
    """The empty 2.0 request answered with the samples-written header: 2.0; a 415 later (the
    receiver changed): the same samples again as 1.0, and 1.0 from then on."""
    class Switching(Receiver):
        async def write(self, request: web.Request) -> web.Response:
            self.got.append((await request.read(), dict(request.headers)))
            two = "io.prometheus.write.v2.Request" in request.headers["Content-Type"]
            if len(self.got) == 1:  # the probe
                return web.Response(status=204, headers={"X-Prometheus-Remote-Write-Samples-Written": "0"})
            return web.Response(status=415 if two else 204)

    rx = Switching([])
    runner, port = await rx.serve()
    onward = _onward(tmp_path, f"- url: http://127.0.0.1:{port}/api/v1/write\n  name: rx\n", [])
    try:
        onward.start()
        onward.queue(_batch(NOW, range(4)))
        await _drain(onward, "rx")
        onward.queue(_batch(NOW + 10_000, range(4)))
        await _drain(onward, "rx")
        versions = [h["X-Prometheus-Remote-Write-Version"] for _, h in rx.got]
        assert versions == ["2.0.0", "2.0.0", "0.1.0", "0.1.0"]
        assert onward.metrics.sent.labels("rx")._value.get() == 8 and onward.metrics.protocol.labels(
            "rx")._value.get() == 1
    finally:
        await onward.close()
        await runner.cleanup()
