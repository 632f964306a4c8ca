"""glibc malloc settings for long-running metricsd processes.

A store decodes batches into NumPy arrays of a few hundred KiB. glibc serves those from mmap
until the first is freed, then raises its mmap threshold (up to 32 MiB) and serves them from the
heap, which fragments and does not shrink; gRPC's threads also each get their own malloc arena.
So the threshold is pinned and arenas are capped at 2.

Where it is pinned is a trade of memory for CPU. At 128 KiB (the first setting: 16% less RSS
than glibc's own choice) every array of a 60,000-sample remote-write batch was a fresh mmap, its
pages faulted in and unmapped again: about 2 million page faults per 14 M samples, 40% of a
store's ingest CPU in the kernel. At 2 MiB, with the heap's top trimmed only past 16 MiB, the same
ingest took 0.47 instead of 0.79 CPU s per million samples for 8% more RSS (perf/RESULTS.md,
"Remote write"); the retention loop's malloc_trim hands the heap's free pages back anyway.
Equivalent to MALLOC_MMAP_THRESHOLD_=2097152 MALLOC_TRIM_THRESHOLD_=16777216 MALLOC_ARENA_MAX=2
in the environment, which this respects when set.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from typing import Any

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

log = logging.getLogger("metricsd.memory")


@functools.cache
def libc_function(name: str) -> Any | None:
    """A C library function of this process (glibc's mallopt, malloc_trim, prctl), or None where
    there is none. Looked up in the symbols already loaded (``CDLL(None)``), once: no ldconfig run,
    which ``ctypes.util.find_library`` would start as a child process each call."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


def tune_malloc(mmap_threshold: int = 2 * 2**20, trim_threshold: int = 16 * 2**20, arena_max: int = 2) -> bool:
    """Apply the settings if this is glibc; returns whether they were applied. Call early."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    ok = True
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and ok
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        ok = bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold)) and ok
    if "MALLOC_ARENA_MAX" not in os.environ:
        ok = bool(mallopt(_M_ARENA_MAX, arena_max)) and ok
    return ok


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the kernel (glibc ``malloc_trim(0)``); whether it did.

    Decoding write batches leaves freed blocks all over the heap that glibc keeps: in a store that
    had taken in 7.3 M samples, RSS fell from 124.5 to 114.8 MiB with nothing else changed
    (perf/RESULTS.md). It locks each malloc arena while it walks it: call it from a worker
    thread, now and then (the retention loop does, once a minute)."""
    trim = libc_function("malloc_trim")
    return trim is not None and bool(trim(0))


def total_memory_bytes() -> int:
    """Memory this process may use: the machine's RAM, or the cgroup v2 limit when lower (a pod's
    memory limit). What the default series limit (metricsd/store/limits.py) is sized from."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
    except OSError:
        return int(total)
    return int(min(total, int(text))) if text.isdigit() else int(total)
