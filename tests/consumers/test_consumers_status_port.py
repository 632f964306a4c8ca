"""Every consumer can serve its status port, and that port answers the kubelet's probe on /healthz
without a token while its decisions still need the read role (what the consumers Deployment of
deploy/kubernetes/ and the Helm chart rely on)."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from metricsd.cmd.consumers import KINDS
from metricsd.cmd.main import build_parser

BIN = Path(sys.executable).parent / "metricsd"
EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_consumer_takes_the_status_port_and_server_security_flags(kind: str) -> None:
    args = build_parser().parse_args([kind, "--spec", "x.yaml", "--http-port", "7410", "--http-host", "0.0.0.0",
                                      "--tls-cert", "c", "--tls-key", "k", "--tokenreview",
                                      "--tokenreview-role", "g=read", "--tls-ca", "ca", "--auth-token-file", "t"])
    assert (args.http_port, args.http_host, args.tokenreview, args.tokenreview_role) == (7410, "0.0.0.0", True,
                                                                                         ["g=read"])
    assert build_parser().parse_args([kind, "--spec", "x.yaml"]).http_port is None  # no listener unless asked


@pytest.mark.slow
def test_the_hpa_status_port_answers_healthz_openly_and_wants_a_read_token_for_the_rest(
        tmp_path: Path, free_ports: Callable[[], int]) -> None:
    from metricsd.security.certs import create_local_pki
    from metricsd.security.tokens import hash_token

    pki = create_local_pki(tmp_path / "pki")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\n")
    port = free_ports()
    proc = subprocess.Popen([str(BIN), "hpa", "--spec", str(EXAMPLES / "hpa.yaml"), "--addr", "127.0.0.1:1",
                             "--http-port", str(port), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
                             "--tokens-file", str(tokens)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = ssl.create_default_context(cafile=str(pki.ca))

    def get(path: str, token: str | None = None) -> tuple[int, str]:
        req = urllib.request.Request(f"https://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            e.close()
            return int(e.code), ""

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = get("/healthz")
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the status port never answered"
                time.sleep(0.2)
        assert health == (200, "ok\n")
        assert get("/api/v1/metricsd/hpa")[0] == 401
        code, body = get("/api/v1/metricsd/hpa", "r")
        assert code == 200 and '"consumer": "hpa"' in body
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=20)[0]
    assert proc.returncode == 0, out
