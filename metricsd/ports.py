"""Free ports for a process about to listen, chosen outside the kernel's ephemeral range.

A port the kernel gives ``bind(0)`` comes from the ephemeral range, the range every outgoing
connection's local port is drawn from too. Between picking such a port and a child process binding
it, any connection on the machine may take it (seen in CI: a store started by a test failed with
"Address already in use" on the port picked for it a moment earlier). Ports outside that range are
never given to outgoing connections, so only another listener can take them, and each process walks
its own sequence of them from a random start, so two pickers rarely meet.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import threading
from collections.abc import Iterator

__all__ = ["ephemeral_range", "free_port", "free_range", "outside", "port_free"]

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 10_000  # below: well-known and registered services' ports
HIGHEST = 65_535
DEFAULT_EPHEMERAL = (32_768, 60_999)  # Linux's default
TRIES = 2_000


def ephemeral_range(path: str = RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive), or Linux's default where it cannot be read."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (low, high) if LOWEST <= low <= high <= HIGHEST else DEFAULT_EPHEMERAL


def outside(ephemeral: tuple[int, int]) -> list[int]:
    """Candidate ports: LOWEST..HIGHEST less the ephemeral range."""
    low, high = ephemeral
    return [*range(LOWEST, low), *range(high + 1, HIGHEST + 1)]


def _walk() -> Iterator[int]:
    ports = outside(ephemeral_range())
    if not ports:  # the whole range is ephemeral: nothing better than the kernel's choice
        return iter(())
    start = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little")).randrange(len(ports))
    return itertools.cycle(ports[start:] + ports[:start])


_lock = threading.Lock()
_ports: Iterator[int] | None = None


def _next_port() -> int | None:
    global _ports
    with _lock:
        if _ports is None:
            _ports = _walk()
        return next(_ports, None)


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (with SO_REUSEADDR, as servers do, so a
    connection of an earlier run in TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, from outside the ephemeral range (falls back to the kernel's)."""
    for _ in range(TRIES):
        port = _next_port()
        if port is None:
            break
        if port_free(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_range(host: str, span: int, tries: int = 200) -> int:
    """A base port B, a multiple of 10, with B .. B + span - 1 all free now and none in the ephemeral
    range (``metricsd cluster up`` and ``chaos`` lay their ports out from one base). Another process
    may still take one before its server binds it. Raises RuntimeError when none is found."""
    low, high = ephemeral_range()
    spans = [(a, b) for a, b in ((LOWEST, low - 1), (high + 1, HIGHEST)) if b - a + 1 >= span + 10]
    rng = random.Random()
    for _ in range(tries):
        if not spans:
            break
        a, b = rng.choice(spans)
        base = rng.randrange(-(-a // 10) * 10, b - span + 2, 10)
        if all(port_free(host, p) for p in range(base, base + span)):
            return base
    raise RuntimeError(f"no free range of {span} ports outside the ephemeral range {low}-{high} on {host}")
