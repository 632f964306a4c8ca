"""A child of ``metricsd cluster up`` / ``metricsd chaos`` ends when its parent does, even when the
parent is SIGKILLed, so that nothing is left listening behind it.

The parent does not set this up in the child with ``preexec_fn``: that makes ``subprocess`` fork()
(instead of vfork()) a process whose gRPC threads are busy, and gRPC's fork handlers then abort
the child or wedge the parent's channels (seen as exit code -11 / "Check failed:
next_worker->state == KICKED" in a 10-minute chaos run). The parent instead names itself in the
child's environment, and the child asks the kernel for SIGTERM on its parent's death first thing.
"""

from __future__ import annotations

import os
import signal

from metricsd.memory import libc_function

__all__ = ["PARENT_ENV", "die_with_parent", "parent_env"]

PARENT_ENV = "METRICSD_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def parent_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child that must end with this process."""
    return {**env, PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """Linux: SIGTERM this process when the parent named in the environment exits. If that parent
    is gone already (it died before this ran), SIGTERM it now. A no-op without the variable."""
    want = os.environ.pop(PARENT_ENV, "")
    if not want.isdigit():
        return
    prctl = libc_function("prctl")
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(want):
        os.kill(os.getpid(), signal.SIGTERM)
