"""The security flags: a non-loopback listener without TLS and tokens is refused unless
--insecure, and ``metricsd token`` makes lines a token file accepts."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from metricsd.cmd.security import require_secure_or_loopback
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ServerSecurity
from metricsd.security.tls import ServerTLS
from metricsd.security.tokens import TokenFile, parse_token_file


def test_metricsd_up_refuses_another_address_without_tls_and_tokens_and_says_why() -> None:
    out = subprocess.run([sys.executable, "-m", "metricsd", "up", "--host", "0.0.0.0", "--no-simulate",
                          "--no-consumers"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert ("metricsd up would listen on 0.0.0.0 without TLS (--tls-cert, --tls-key) and tokens (--tokens-file or "
            "--tokenreview): anyone who reaches the port could read and write metrics. Give them, or --insecure "
            "to accept that") in out.stderr


def test_loopback_needs_nothing_and_insecure_is_a_logged_choice(pki: LocalPKI, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    plain = ServerSecurity()
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        require_secure_or_loopback(host, plain, insecure=False, what="x")
    with pytest.raises(ValueError, match="without tokens"):
        require_secure_or_loopback("10.0.0.1", ServerSecurity(ServerTLS(pki.cert, pki.key)), False, "x")
    tokens = tmp_path / "tokens"
    tokens.write_text("")
    require_secure_or_loopback("10.0.0.1", ServerSecurity(ServerTLS(pki.cert, pki.key),
                                                          Authenticator(TokenFile(tokens))), False, "x")
    caplog.set_level(logging.WARNING, "metricsd.security")
    require_secure_or_loopback("0.0.0.0", plain, insecure=True, what="metricsd proxy")
    assert "metricsd proxy listens on 0.0.0.0 without TLS" in caplog.text


def test_token_new_prints_a_token_and_the_line_that_admits_it() -> None:
    out = subprocess.run([sys.executable, "-m", "metricsd", "token", "new", "--name", "grafana", "--role", "read"],
                         capture_output=True, text=True, check=True)
    token, line = out.stdout.splitlines()
    ids = parse_token_file([line])
    assert len(ids) == 1 and token not in line
    (identity,) = ids.values()
    assert identity.name == "grafana" and [r.value for r in identity.roles] == ["read"]
