"""A small real filesystem for disk-full tests: a 40 MiB tmpfs mounted by the test (root only; the
test is skipped with the reason otherwise), and metricsd/cmd/diskfill.py's filler."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from metricsd.cmd.diskfill import fill, free_bytes, mount_tmpfs, umount

__all__ = ["fill", "free_bytes", "small_fs"]


@contextlib.contextmanager
def small_fs(where: Path, size: str = "40m") -> Iterator[Path]:
    """``where`` with a fresh tmpfs of ``size`` mounted on it."""
    why_not = mount_tmpfs(where, size)
    if why_not:
        pytest.skip(f"{why_not}: no small real filesystem to fill; run as root to include this test")
    try:
        yield where
    finally:
        umount(where)
