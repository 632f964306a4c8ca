"""The operator faults of ``metricsd chaos`` that need more than a signal: damaged files at a restart, a
full disk, and a killed launcher. Each helper does one thing to real files or processes; the runner
(chaos.py) sequences them and checks what the cluster made of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from metricsd.store.snapshot import list_snapshots
from metricsd.store.wal.log import list_segments, segment_path
from metricsd.store.wal.record import SEGMENT_HEADER_SIZE

__all__ = ["DAMAGE_FOUND", "damage_store_files", "kill_pid", "launcher_killed", "log_size", "mentions_since",
           "pid_gone", "start_under_launcher", "wait_gone", "wait_handoff", "wipe_dir"]

# What a store's log says when it finds damaged files at a start (metricsd/store/recovery.py, durable.py).
DAMAGE_FOUND = ("unusable (", "may have lost acknowledged data")


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def damage_store_files(data_dir: Path, rng: random.Random) -> list[str]:
    """Flip a byte in the middle of the newest snapshot and of a WAL segment the next start replays
    (the one before the newest that holds records, so the damage is not a torn tail: a crash never
    leaves that). Returns what was done, one phrase per file (empty: nothing to damage yet)."""
    done = []
    snaps = list_snapshots(data_dir / "snapshots")
    if snaps:
        _, path = snaps[-1]
        offset = rng.randrange(path.stat().st_size // 4, 3 * path.stat().st_size // 4)
        _flip(path, offset)
        done.append(f"{path.name} at byte {offset}")
    replay_from = snaps[-2][0] if len(snaps) > 1 else (snaps[-1][0] if snaps else 1)
    wal = data_dir / "wal"
    full = [s for s in list_segments(wal) if s >= replay_from
            and segment_path(wal, s).stat().st_size > SEGMENT_HEADER_SIZE + 64]
    if full:
        seg = full[-2] if len(full) > 1 else full[-1]
        path = segment_path(wal, seg)
        size = path.stat().st_size
        quarter = (size - SEGMENT_HEADER_SIZE) // 4
        offset = rng.randrange(SEGMENT_HEADER_SIZE + quarter, size - quarter)
        _flip(path, offset)
        done.append(f"{path.name} at byte {offset}")
    return done


def wipe_dir(path: Path) -> None:
    """Remove everything under ``path`` but ``path`` itself (it may be a mount point)."""
    if not path.exists():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def mentions_since(path: Path, offset: int, needles: tuple[str, ...]) -> int:
    """Lines of ``path`` after byte ``offset`` that contain any of ``needles``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return 0
    return sum(any(n in line for n in needles) for line in text.splitlines())


def start_under_launcher(argv: list[str], log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``argv`` started by a launcher process of its own (``python -m metricsd.cmd.launch``), as
    ``cluster up`` starts its children; returns the launcher and the child's pid. Call from a thread
    that outlives the launcher (see metricsd/parentdeath.py)."""
    from metricsd.parentdeath import parent_env

    launcher = subprocess.Popen([sys.executable, "-m", "metricsd.cmd.launch", str(log), "--", *argv],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=parent_env(dict(os.environ)),
                                start_new_session=True)
    assert launcher.stdout is not None
    line = launcher.stdout.readline()
    launcher.stdout.close()
    if not line.strip().isdigit():
        launcher.kill()
        launcher.wait()
        raise RuntimeError(f"the launcher did not start {argv[:6]}...: {line!r}")
    return launcher, int(line)


def pid_gone(pid: int) -> bool:
    """The process has exited (gone, or a zombie its new parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pid_gone(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)  # polling another process
    return True


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def launcher_killed(argv: list[str], log: Path, serving: Callable[[], Awaitable[bool]]) -> tuple[int, bool]:
    """Start ``argv`` under a launcher of its own, SIGKILL the launcher once ``serving()`` (or after a
    minute), and wait up to 30 s for the child to end with it. Returns the child's pid and whether it
    ended; one that did not (an orphan) is killed."""
    launcher, child = start_under_launcher(argv, log)
    deadline = time.monotonic() + 60
    while not await serving() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    launcher.kill()
    await asyncio.to_thread(launcher.wait)
    if await wait_gone(child, 30.0):
        return child, True
    kill_pid(child)
    await wait_gone(child, 10.0)
    return child, False


async def wait_handoff(stats: Callable[[], Awaitable[list[Mapping[str, int] | None]]], timeout_s: float) -> float:
    """Seconds until no proxy holds a hint (queued = delivered + dropped, from each proxy's Stats;
    None for a proxy that did not answer). Raises RuntimeError after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        pending = 0
        for rej in await stats():
            if rej is None:
                pending += 1
                continue
            pending += (rej.get("proxy_handoff_queued", 0) - rej.get("proxy_handoff_delivered", 0)
                        - rej.get("proxy_handoff_dropped", 0))
        if pending <= 0:
            return time.monotonic() - t0
        await asyncio.sleep(0.5)
    raise RuntimeError(f"hinted hand-off not done {timeout_s:.0f} s after the disk had room again")
