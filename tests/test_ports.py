"""Ports for test and launcher processes: outside the kernel's ephemeral range, so that no outgoing
connection can take one between the pick and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from metricsd.ports import (
    DEFAULT_EPHEMERAL,
    HIGHEST,
    LOWEST,
    ephemeral_range,
    free_port,
    free_range,
    outside,
    port_free,
)


def test_the_range_is_read_from_the_kernel_and_a_bad_file_falls_back(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(str(f)) == (40_000, 50_000)
    f.write_text("nonsense\n")
    assert ephemeral_range(str(f)) == DEFAULT_EPHEMERAL
    assert ephemeral_range(str(tmp_path / "absent")) == DEFAULT_EPHEMERAL


@given(st.integers(LOWEST, HIGHEST), st.integers(0, 30_000))
def test_candidates_are_every_port_but_the_ephemeral_ones(low: int, width: int) -> None:
    high = min(low + width, HIGHEST)
    ports = outside((low, high))
    assert not any(low <= p <= high for p in ports)
    assert len(ports) == (HIGHEST - LOWEST + 1) - (high - low + 1)
    assert len(set(ports)) == len(ports)


def test_picked_ports_are_outside_the_ephemeral_range_distinct_and_bindable() -> None:
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert not any(low <= p <= high for p in ports)
    for p in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_listening_port_is_not_free_and_is_skipped() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        s.listen()
        taken = s.getsockname()[1]
        assert not port_free("127.0.0.1", taken)
        assert taken not in {free_port() for _ in range(50)}


def test_a_range_is_free_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    base = free_range("127.0.0.1", 200)
    assert base % 10 == 0
    assert not any(low <= p <= high for p in range(base, base + 200))
    assert all(port_free("127.0.0.1", p) for p in range(base, base + 200))
