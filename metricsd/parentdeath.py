"""A child of ``metricsd cluster up`` / ``metricsd chaos`` ends when its parent does, even when the
parent is SIGKILLed, so that nothing is left listening behind it.

The parent does not set this up in the child with ``preexec_fn``: that makes ``subprocess`` fork()
(instead of vfork()) a process whose gRPC threads are busy, and gRPC's fork handlers then abort
the child or wedge the parent's channels (seen as exit code -11 / "Check failed:
next_worker->state == KICKED" in a 10-minute chaos run). So:

- a metricsd child is told its parent in the environment (:func:`parent_env`) and asks the kernel
  for SIGTERM on its parent's death first thing (:func:`die_with_parent`, from ``metricsd.cmd.main``),
  which still lets it stop cleanly (a store writes its final snapshot);
- a program that is not ours (etcd) is started through :func:`exec_argv`: a few lines of Python
  (``python -S``, no site imports, ~15 ms) that set PR_SET_PDEATHSIG (SIGKILL by default), check
  that the parent is still the launcher, then exec the program, which keeps the setting.

Both check the parent after the prctl: a launcher killed between its fork and the child's prctl
would otherwise leave the child running, adopted by init.

Linux sends the signal when the *thread* that started the child ends, not the process: start
children from a thread that lives as long as the launcher (the main thread or the event loop's),
never from a pool thread (``asyncio.to_thread``) that may end first.
"""

from __future__ import annotations

import os
import signal
import sys

from metricsd.memory import libc_function

__all__ = ["PARENT_ENV", "die_with_parent", "exec_argv", "parent_env"]

PARENT_ENV = "METRICSD_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1

# argv[1]: the launcher's pid; argv[2]: the signal; argv[3:]: the program and its arguments.
# Exit status 126 (cannot set up) and 127 (exec failed) as a shell would; 1 when the launcher is gone.
_WRAPPER = """\
import ctypes, os, sys
parent, sig, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, sig, 0, 0, 0) != 0:
    sys.stderr.write("prctl(PR_SET_PDEATHSIG) failed: %s\\n" % os.strerror(ctypes.get_errno()))
    os._exit(126)
if os.getppid() != parent:
    os._exit(1)
try:
    os.execv(argv[0], argv)
except OSError as e:
    sys.stderr.write("cannot run %s: %s\\n" % (argv[0], e))
    os._exit(127)
"""


def exec_argv(argv: list[str], sig: signal.Signals = signal.SIGKILL) -> list[str]:
    """``argv`` (an absolute program path first) wrapped so that the program gets ``sig`` when
    the calling thread of this process ends, however it ends. Start it with ``subprocess.Popen``
    and no ``preexec_fn``."""
    if not os.path.isabs(argv[0]):
        raise ValueError(f"exec_argv needs an absolute program path, got {argv[0]!r}")
    return [sys.executable, "-S", "-c", _WRAPPER, str(os.getpid()), str(int(sig)), *argv]


def parent_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a metricsd child that must end with this process."""
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
