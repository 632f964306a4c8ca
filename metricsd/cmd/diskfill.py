"""A small real filesystem that can be filled to the last byte: what ``metricsd chaos`` (and the
disk-full tests) put one store's data directory on, to see a full disk as an operator does.

:func:`mount_tmpfs` mounts a tmpfs of a given size (root only: mount(2) needs CAP_SYS_ADMIN);
:func:`fill` writes a file until not one more byte fits, halving its writes down to one byte, and
returns it: deleting it gives the space back.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

__all__ = ["fill", "free_bytes", "mount_tmpfs", "umount"]


def mount_tmpfs(where: Path, size: str) -> str:
    """Mount a tmpfs of ``size`` (e.g. "40m") on ``where`` (created). Returns "" when mounted, else
    why not (not root, no mount here)."""
    if os.geteuid() != 0:
        return f"needs root to mount a {size} tmpfs (mount -t tmpfs -o size={size} tmpfs DIR)"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    return "" if done.returncode == 0 else f"cannot mount a tmpfs on {where}: {done.stderr.strip()}"


def umount(where: Path) -> None:
    """Unmount (lazily if something still has a file open there)."""
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(fs: Path, name: str = "filler") -> Path:
    """Write ``fs/name`` until the filesystem has no byte left; returns it. Raises OSError for
    anything but ENOSPC."""
    filler = fs / name
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = 1 << 20
        while size:
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                size //= 2
    finally:
        os.close(fd)
    return filler
