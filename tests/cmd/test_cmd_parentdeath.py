"""A child started the way ``cluster up`` and ``chaos`` start their processes ends with its parent,
even when the parent is SIGKILLed, and is started without a fork handler run (vfork path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from metricsd.parentdeath import PARENT_ENV, parent_env

CHILD = textwrap.dedent("""
    import sys, time
    from metricsd.parentdeath import die_with_parent
    die_with_parent()
    print("up", flush=True)
    time.sleep(60)
""")


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split()[2] == "Z":  # exited, not yet reaped by init
                return True
        time.sleep(0.05)  # polling another process's state
    return False


def test_parent_env_names_this_process() -> None:
    assert parent_env({"A": "1"}) == {"A": "1", PARENT_ENV: str(os.getpid())}


def test_child_whose_named_parent_is_gone_stops_at_once() -> None:
    env = {**os.environ, PARENT_ENV: "1"}  # pid 1 is not our parent
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, timeout=30)
    assert out.returncode == -signal.SIGTERM
    assert b"up" not in out.stdout


@pytest.mark.slow
def test_child_ends_when_its_parent_is_killed() -> None:
    parent_code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from metricsd.parentdeath import parent_env
        child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env=parent_env(dict(os.environ)),
                                 stdout=subprocess.PIPE, start_new_session=True)
        assert child.stdout is not None and child.stdout.readline() == b"up\\n"
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    os.kill(child_pid, 0)  # running
    parent.kill()
    parent.wait(10)
    parent.stdout.close()
    assert _gone(child_pid), "the child outlived its SIGKILLed parent"
