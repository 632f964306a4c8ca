"""Shared fixtures: free loopback ports, the repository root, and a running `metricsd up`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from metricsd.ports import free_port
from metricsd.security.certs import LocalPKI, create_local_pki

ROOT = Path(__file__).resolve().parents[1]




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
