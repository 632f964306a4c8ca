"""metricsd/memory.py against the real glibc allocator, in a fresh process each."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

FRAGMENT = textwrap.dedent("""
    import sys
    from metricsd.memory import release_free_memory, tune_malloc

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    tune_malloc()
    # 2 KiB blocks (past pymalloc, below the mmap threshold: glibc's heap) with a small block
    # kept between every 64 of them, so that the freed space is holes the heap top cannot give back.
    blocks = [bytes(2048) for _ in range(100_000)]
    keep = [bytes(600) for _ in range(100_000 // 64)]
    del blocks[:]
    before = rss()
    ok = release_free_memory()
    after = rss()
    print(ok, before, after, len(keep))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_free_memory_returns_the_heaps_holes_to_the_kernel() -> None:
    out = subprocess.run([sys.executable, "-c", FRAGMENT], capture_output=True, text=True, timeout=60, check=True)
    ok, before, after, _ = out.stdout.split()
    assert ok == "True"
    assert int(before) - int(after) > 100 * 2**20, out.stdout  # ~195 MiB were freed into holes
