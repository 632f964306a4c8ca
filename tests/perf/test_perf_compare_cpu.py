"""A process's CPU in nanoseconds (perf/compare_cpu.py): the parsers, each source against a real
child process that burns a known amount of CPU, and the fallbacks."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "perf"))

import compare_cpu
from compare_cpu import (
    TICK_HZ,
    clock_source,
    cpu_ns,
    parse_schedstat,
    parse_stat_ticks,
    process_clock_id,
    process_clock_ns,
    schedstat_ns,
    ticks_ns,
)

# A name with spaces and parentheses, as a process may set: the fields are counted after the last ')'
STAT = ("4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 2101 0 0 0 137 29 0 0 20 0 3 0 98765 "
        "123456789 4321 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0")


def test_stat_ticks_are_utime_plus_stime_after_the_last_parenthesis() -> None:
    assert parse_stat_ticks(STAT) == 137 + 29


@pytest.mark.parametrize("text", ["", "4242 S 1 2 3", "4242 (x) S 1 2"])
def test_a_stat_line_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_stat_ticks(text)


def test_schedstat_is_its_first_field_in_nanoseconds() -> None:
    assert parse_schedstat("1234567890123 45678 910\n") == 1234567890123


@pytest.mark.parametrize("text", ["", "12 34", "12 34 56 78", "x 1 2"])
def test_a_schedstat_line_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_schedstat(text)


def test_the_process_clock_id_is_linuxs_make_process_cpuclock() -> None:
    # (~pid << 3) | CPUCLOCK_SCHED, as glibc's clock_getcpuclockid returns: pid 1 -> -14, 4242 -> -33942
    assert process_clock_id(1) == -14
    assert process_clock_id(4242) == -33942
    with pytest.raises(ValueError):
        process_clock_id(0)


def _fake_proc(tmp: Path, pid: int, schedstats: list[str], stat: str) -> Path:
    for i, line in enumerate(schedstats):
        (tmp / str(pid) / "task" / str(pid + i)).mkdir(parents=True)
        (tmp / str(pid) / "task" / str(pid + i) / "schedstat").write_text(line)
    (tmp / str(pid)).mkdir(parents=True, exist_ok=True)
    (tmp / str(pid) / "stat").write_text(stat)
    return tmp


def test_schedstat_sums_every_thread_and_skips_an_unreadable_one(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, 4242, ["1000 5 1\n", "2500 7 2\n", ""], STAT)
    assert schedstat_ns(4242, proc) == 3500
    assert schedstat_ns(999, proc) is None  # no such process: the caller falls back


def test_ticks_are_nanoseconds_in_whole_ticks(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, 4242, [], STAT)
    assert ticks_ns(4242, proc) == 166 * 1_000_000_000 // TICK_HZ


def test_cpu_ns_falls_back_to_schedstat_then_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare_cpu, "process_clock_ns", lambda pid: None)
    monkeypatch.setattr(compare_cpu, "schedstat_ns", lambda pid: 777)
    monkeypatch.setattr(compare_cpu, "ticks_ns", lambda pid: 10_000_000)
    assert cpu_ns(1) == 777
    assert clock_source(1) == "schedstat"
    monkeypatch.setattr(compare_cpu, "schedstat_ns", lambda pid: None)
    assert cpu_ns(1) == 10_000_000
    assert clock_source(1) == "ticks"


# The child burns 0.3 s of CPU in a thread that then exits, 0.2 s in its main thread, then sleeps
_BURN = """
import threading, time
def burn(s):
    t = time.thread_time()
    while time.thread_time() - t < s:
        pass
th = threading.Thread(target=burn, args=(0.3,)); th.start(); th.join()
burn(0.2)
print("done", flush=True)
time.sleep(30)
"""


def test_a_real_process_the_clock_keeps_an_exited_threads_time_schedstat_loses_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", _BURN], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        time.sleep(0.05)
        pid = child.pid
        clock = process_clock_ns(pid)
        assert clock is not None and clock_source(pid) == "process-clock"
        sched, ticks = schedstat_ns(pid), ticks_ns(pid)
        assert sched is not None
        assert 0.5e9 <= clock < 2.0e9  # the 0.5 s burnt, and the interpreter's start-up
        assert clock - sched >= 0.28e9  # the exited thread's 0.3 s: in the clock, gone from schedstat
        tick = 1e9 / TICK_HZ
        assert abs(clock - ticks) <= 3 * tick  # the tick reading rounds each thread's time down
        assert cpu_ns(pid) >= clock
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert process_clock_ns(child.pid) is None  # reaped: no clock, and cpu_ns raises from the tick file
    with pytest.raises(OSError):
        cpu_ns(child.pid)
