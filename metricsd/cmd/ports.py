"""Which process holds a TCP port: what a launcher says before it refuses to start.

``metricsd cluster up`` and ``metricsd chaos`` need a whole range of ports on one host. A port
already taken (most often by a process of an earlier run, or another program's default) would
make one child exit at start while the rest came up against it, so the launcher checks every
port first and names the holder: the kernel's socket tables (``/proc/net/tcp`` and ``tcp6``) give
the socket's inode, and the ``socket:[inode]`` links under ``/proc/<pid>/fd`` give the process.
Another user's processes are invisible to an unprivileged launcher; it then says so.

The parsing is pure (:func:`parse_proc_net_tcp`); the rest reads /proc. Linux only: elsewhere the
holder is "unknown".
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from metricsd.ports import free_range, port_free

__all__ = ["Holder", "TcpSocket", "describe_taken", "free_range", "holders_of", "parse_proc_net_tcp", "port_free",
           "taken_ports"]

_LISTEN = 0x0A
_STATES = {0x01: "ESTABLISHED", 0x06: "TIME_WAIT", 0x08: "CLOSE_WAIT", _LISTEN: "LISTEN"}


@dataclass(frozen=True)
class TcpSocket:
    host: str  # local address, as text ("127.0.0.1", "::"; an IPv4-mapped IPv6 address as IPv4)
    port: int
    state: int  # the kernel's TCP state number (0x0A: LISTEN)
    inode: int

    @property
    def listening(self) -> bool:
        return self.state == _LISTEN

    def describe_state(self) -> str:
        return _STATES.get(self.state, f"state {self.state:#04x}")


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str  # the command line, shortened

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command})"


def _address(hex_addr: str) -> str:
    """/proc/net/tcp prints an address as 32-bit words in host byte order, each as %08X."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)) if _little_endian() else raw
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)  # an IPv4 socket opened as IPv6 (dual stack)
    return str(ip)


def _little_endian() -> bool:
    return sys.byteorder == "little"


def parse_proc_net_tcp(text: str) -> list[TcpSocket]:
    """The sockets of one /proc/net/tcp or /proc/net/tcp6 file (its header line skipped; lines
    that do not parse are left out)."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        with contextlib.suppress(ValueError):
            addr, _, port = fields[1].partition(":")
            out.append(TcpSocket(_address(addr), int(port, 16), int(fields[3], 16), int(fields[9])))
    return out


def _sockets(proc: Path) -> list[TcpSocket]:
    out: list[TcpSocket] = []
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            out += parse_proc_net_tcp((proc / "net" / name).read_text())
    return out


def _covers(bound: str, host: str) -> bool:
    """A socket bound to ``bound`` takes the port from a bind to ``host`` (the wildcard takes it everywhere)."""
    try:
        b, h = ipaddress.ip_address(bound), ipaddress.ip_address(host)
    except ValueError:
        return True
    if isinstance(b, ipaddress.IPv6Address) and b.ipv4_mapped is not None:
        b = b.ipv4_mapped
    if isinstance(h, ipaddress.IPv6Address) and h.ipv4_mapped is not None:
        h = h.ipv4_mapped
    return b.is_unspecified or h.is_unspecified or b == h


def _command(pid: str, proc: Path) -> str:
    try:
        argv = (proc / pid / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    text = " ".join(" ".join(a.decode(errors="replace").split()) for a in argv)
    return text if len(text) <= 160 else text[:157] + "..."


def _owners(inodes: set[int], proc: Path) -> dict[int, Holder]:
    """inode -> the first process found holding it (every process's fds are scanned once)."""
    want = {f"socket:[{i}]": i for i in inodes}
    found: dict[int, Holder] = {}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        fd_dir = proc / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            inode = want.get(target)
            if inode is not None and inode not in found:
                found[inode] = Holder(int(pid), _command(pid, proc))
        if len(found) == len(want):
            break
    return found


def holders_of(host: str, port: int, proc: Path = Path("/proc")) -> tuple[list[TcpSocket], dict[int, Holder]]:
    """The sockets that keep ``host:port`` from being bound (listening ones first) and, by inode,
    the processes holding them where this user can see them."""
    socks = [s for s in _sockets(proc) if s.port == port and _covers(s.host, host)]
    socks.sort(key=lambda s: not s.listening)
    return socks, _owners({s.inode for s in socks if s.inode}, proc)


def describe_taken(host: str, port: int, role: str, proc: Path = Path("/proc")) -> str:
    """One line naming the port, what needs it and, where it can, the process holding it."""
    socks, owners = holders_of(host, port, proc)
    who = "a process this user cannot see"
    for s in socks:
        holder = owners.get(s.inode)
        if holder is not None:
            who = f"{holder}, {s.describe_state()} on {s.host}:{s.port}"
            break
    else:
        if not socks:
            who = "an unknown process"
    return f"port {port} ({role}) on {host} is in use by {who}"


def taken_ports(host: str, wanted: dict[int, str], proc: Path = Path("/proc")) -> list[str]:
    """A line per port of ``wanted`` (port -> what needs it) that cannot be bound now."""
    return [describe_taken(host, port, role, proc) for port, role in sorted(wanted.items())
            if not port_free(host, port)]
