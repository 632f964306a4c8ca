"""Helpers for tests that run real processes: stop one as a service manager would."""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["stop_process"]


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; closes its stdout pipe."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
