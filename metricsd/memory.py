"""glibc malloc settings for long-running metricsd processes.

A store decodes batches into NumPy arrays of a few hundred KiB. glibc serves those from mmap
until the first is freed, then raises its mmap threshold (up to 32 MiB) and serves them from the
heap, which fragments and does not shrink; gRPC's threads also each get their own malloc arena.
So the threshold is pinned and arenas are capped at 2.

Where it is pinned is a trade of memory for CPU. At 128 KiB (the first setting: 16% less RSS
than glibc's own choice) every array of a 60,000-sample remote-write batch was a fresh mmap, its
pages faulted in and unmapped again: about 2 million page faults per 14 M samples, 40% of a
store's ingest CPU in the kernel. At 2 MiB the same ingest took 0.47 instead of 0.79 CPU s per
million samples for 8% more RSS (perf/RESULTS.md, "Remote write").

A query's temporaries (a window matrix of 50,000 series, several MiB, above the mmap threshold)
are likewise mmap'd afresh and page-faulted in every time, unless the heap's top has room for
them: glibc takes a large block from the top before it calls mmap. So the heap grows in steps of
``top_pad`` and keeps up to ``trim_threshold`` free at its top (the retention loop's malloc_trim
still hands it back once a minute): a pushed-down question over 50,000 series took twice as long
without (perf/RESULTS.md, "Selection over many series").

Equivalent to MALLOC_MMAP_THRESHOLD_=2097152 MALLOC_ARENA_MAX=2 MALLOC_TOP_PAD_=33554432
MALLOC_TRIM_THRESHOLD_=67108864 in the environment, which this respects when set.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from typing import Any

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
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


def tune_malloc(mmap_threshold: int = 2 * 2**20, arena_max: int = 2, top_pad: int = 32 * 2**20,
                trim_threshold: int = 64 * 2**20) -> bool:
    """Apply the settings if this is glibc; returns whether they were applied. Call early."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    ok = True
    for env, param, value in (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, mmap_threshold),
                              ("MALLOC_ARENA_MAX", _M_ARENA_MAX, arena_max),
                              ("MALLOC_TOP_PAD_", _M_TOP_PAD, top_pad),
                              ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, trim_threshold)):
        if env not in os.environ:
            ok = bool(mallopt(param, value)) and ok
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
