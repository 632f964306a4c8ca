"""A server process's CPU time in nanoseconds, for the CPU column of perf/compare.py and
perf/bench_reads.py (CPU per question summed over every process of a system).

The column was utime + stime from /proc/<pid>/stat: clock ticks of 10 ms, so 200 queries of a
window were read in steps of 0.05 ms a query, as large as the gaps measured between arms. Read
here, in order of preference:

1. **The process's CPU-time clock** (``clock_gettime`` of ``MAKE_PROCESS_CPUCLOCK(pid,
   CPUCLOCK_SCHED)``, what glibc's ``clock_getcpuclockid(pid)`` returns; Python has no wrapper
   for it): the scheduler's nanoseconds of the whole thread group, the running thread's current
   slice included, and the threads that have exited (the kernel keeps their sum in the group's
   signal struct). Linux lets any process read another's.
2. **/proc/<pid>/task/*/schedstat** summed: the first field of each is that thread's on-CPU
   nanoseconds, but a thread that exited inside the window takes its time with it, and a
   running thread's figure is brought up to date only at a tick or a switch.
3. **utime + stime** ticks (``ticks_ns``), the old reading, when neither is there.

``clock_source`` says which one a pid is read with, so a result can state it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["CPUCLOCK_SCHED", "clock_source", "cpu_ns", "cpu_seconds", "parse_schedstat", "parse_stat_ticks",
           "process_clock_id", "process_clock_ns", "schedstat_ns", "ticks_ns"]

TICK_HZ = os.sysconf("SC_CLK_TCK")
CPUCLOCK_SCHED = 2  # linux/posix-timers.h: the scheduler's runtime in ns (PROF and VIRT are tick-based)


def parse_schedstat(text: str) -> int:
    """The first field of a /proc/.../schedstat line: nanoseconds on the CPU. Raises ValueError
    on anything else (an empty or foreign file), so that a reader falls back instead of adding 0."""
    fields = text.split()
    if len(fields) != 3:
        raise ValueError(f"not a schedstat line: {text[:80]!r}")
    return int(fields[0])


def parse_stat_ticks(text: str) -> int:
    """utime + stime (fields 14 and 15) of a /proc/<pid>/stat line, in clock ticks. The command
    name (field 2, in parentheses) may hold spaces and parentheses itself: split after its last ')'."""
    head, sep, rest = text.rpartition(")")
    if not sep or "(" not in head:
        raise ValueError(f"not a stat line: {text[:80]!r}")
    fields = rest.split()
    if len(fields) < 13:
        raise ValueError(f"stat line too short: {text[:80]!r}")
    return int(fields[11]) + int(fields[12])


def process_clock_id(pid: int) -> int:
    """``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)``: ``(~pid << 3) | 2`` (a negative clock id:
    the kernel reads a pid's clock from it; no per-thread bit, so the whole thread group)."""
    if pid <= 0:
        raise ValueError(f"pid must be positive, got {pid}")
    return ((~pid) << 3) | CPUCLOCK_SCHED


def process_clock_ns(pid: int) -> int | None:
    """The whole process's CPU nanoseconds, exited threads included; None when the clock cannot
    be read (not Linux, the process gone)."""
    try:
        return time.clock_gettime_ns(process_clock_id(pid))
    except (OSError, AttributeError):
        return None


def schedstat_ns(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The sum of the first schedstat field over the process's live threads; None without schedstat."""
    total, seen = 0, False
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += parse_schedstat((task / "schedstat").read_text())
            seen = True
        except (OSError, ValueError):  # a thread that ended between the listing and the read
            continue
    return total if seen else None


def ticks_ns(pid: int, proc: Path = Path("/proc")) -> int:
    """utime + stime of /proc/<pid>/stat as nanoseconds (whole ticks: 10 ms steps at 100 Hz)."""
    return parse_stat_ticks((proc / str(pid) / "stat").read_text()) * 1_000_000_000 // TICK_HZ


def clock_source(pid: int) -> str:
    """``process-clock``, ``schedstat`` or ``ticks``: what :func:`cpu_ns` reads ``pid`` with now."""
    if process_clock_ns(pid) is not None:
        return "process-clock"
    return "schedstat" if schedstat_ns(pid) is not None else "ticks"


def cpu_ns(pid: int) -> int:
    """``pid``'s CPU nanoseconds so far, from the first source of the module's list that answers."""
    ns = process_clock_ns(pid)
    if ns is None:
        ns = schedstat_ns(pid)
    return ticks_ns(pid) if ns is None else ns


def cpu_seconds(pid: int) -> float:
    """:func:`cpu_ns` in seconds (perf/procstat.py's ``cpu_seconds``, to the nanosecond)."""
    return cpu_ns(pid) / 1e9
