"""Shared fixtures: free loopback ports, the repository root, and a running `metricsd up`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from metricsd.ports import free_port
from metricsd.security.certs import LocalPKI, create_local_pki

ROOT = Path(__file__).resolve().parents[1]

# No per-example deadline: hypothesis' default (200 ms an example) is a timing assertion, which on the
# shared 2-core machine failed a correct property test (test_consumers_recording, an example that
# took 592 ms at load 8). Speed is measured in perf/, never by a test; a test that hangs still meets
# pytest's own timeout. A test's own @settings(max_examples=...) keeps this.
settings.register_profile("metricsd", deadline=None)
settings.load_profile("metricsd")




@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def free_ports() -> Callable[[], int]:
    """A function returning a fresh free loopback port each call."""
    return free_port


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPKI:
    """A throw-away CA and a loopback certificate (server and client), made once per run."""
    return create_local_pki(tmp_path_factory.mktemp("pki"))
