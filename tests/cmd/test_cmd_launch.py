"""What an operator meets when a launcher (``cluster up``, ``chaos``) starts or dies: a taken port is
named with its holder, "ready" means every child serves, a child that dies is reported with its log's
tail, and nothing outlives a launcher killed with SIGKILL, etcd included."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from polling import wait_until_sync

from metricsd.cmd.clusterplan import ClusterPlan
from metricsd.cmd.launch import LaunchError, LocalCluster, log_tail
from metricsd.cmd.ports import parse_proc_net_tcp, port_free, taken_ports
from metricsd.parentdeath import exec_argv
from metricsd.ports import free_port, free_range

ROOT = Path(__file__).resolve().parents[2]

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1D3F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 29952 1 0 100 0 0 10 0
   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1125 1 0 100 0 0 10 0
   2: 0100007F:D2F0 0100007F:1D3F 01 00000000:00000000 00:00000000 00000000     0        0 31337 1 0 20 4 30 10 -1
   3: garbage
"""
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:8458 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 29267 1 0 100 0 0 10 0
   1: 00000000000000000000000000000000:1D3F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0
"""  # noqa: E501


@pytest.mark.skipif(sys.byteorder != "little", reason="the sample tables are a little-endian kernel's")
def test_the_kernels_socket_tables_parse_to_addresses_ports_states_and_inodes() -> None:
    v4 = parse_proc_net_tcp(PROC_NET_TCP)
    assert [(s.host, s.port, s.listening, s.inode) for s in v4] == [
        ("127.0.0.1", 7487, True, 29952), ("0.0.0.0", 2024, True, 1125), ("127.0.0.1", 54000, False, 31337)]
    v6 = parse_proc_net_tcp(PROC_NET_TCP6)
    assert [(s.host, s.port, s.inode) for s in v6] == [("127.0.0.1", 33880, 29267), ("::", 7487, 4242)]


def test_a_taken_port_is_named_with_the_process_that_holds_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_free("127.0.0.1", port)
        [line] = taken_ports("127.0.0.1", {port: "etcd peer", _free(): "store-1 gRPC"})
        assert line.startswith(f"port {port} (etcd peer) on 127.0.0.1 is in use by pid {os.getpid()} (")
        assert f"LISTEN on 127.0.0.1:{port}" in line
    assert port_free("127.0.0.1", port)


def test_a_launcher_refuses_to_start_when_a_port_of_its_plan_is_taken(tmp_path: Path) -> None:
    plan = ClusterPlan(base_port=_free_base(), stores=1, proxies=1, config_servers=1, simulate=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", plan.base_port + 79))
        s.listen()
        cluster = LocalCluster(plan, tmp_path)
        with pytest.raises(LaunchError, match=rf"port {plan.base_port + 79} \(etcd client\) on 127.0.0.1 is in use "
                                              rf"by pid {os.getpid()} .*choose another --base-port"):
            asyncio.run(cluster.start(30))
    assert not cluster.procs and not cluster.etcd.running  # nothing was started


def test_a_log_tail_is_the_last_lines_indented(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, 3) == "    line 97\n    line 98\n    line 99"
    assert "unreadable" in log_tail(tmp_path / "missing.log")


def test_the_exec_wrapper_needs_an_absolute_program() -> None:
    with pytest.raises(ValueError, match="absolute"):
        exec_argv(["etcd"])


def test_a_program_started_through_the_exec_wrapper_ends_when_its_parent_is_killed() -> None:
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        from metricsd.parentdeath import exec_argv
        child = subprocess.Popen(exec_argv([{_sleep()!r}, "60"]))
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, cwd=ROOT)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    wait_until_sync("the wrapper to exec the program", lambda: _command(child).startswith(_sleep()))
    parent.kill()
    parent.wait(10)
    parent.stdout.close()
    wait_until_sync(f"pid {child} to end with its SIGKILLed parent", lambda: _gone(child))


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_ready_means_serving_and_a_child_that_dies_is_reported_with_its_log_tail(tmp_path: Path) -> None:
    plan = ClusterPlan(base_port=_free_base(), stores=1, proxies=1, config_servers=1, rf=1, w=1, r=1, slots=4,
                       simulate=False)
    cluster = LocalCluster(plan, tmp_path)
    try:
        await cluster.start(120)
        assert not await cluster._not_ready()  # every gRPC child answers, the store SERVING, proxy HTTP listens
        second = LocalCluster(plan, tmp_path / "again")  # the same ports, while the first runs
        with pytest.raises(LaunchError, match=rf"port {plan.base_port} \(proxy-1 HTTP\).* in use by pid "
                                              rf"{cluster.procs['proxy-1'].pid} \(.*metricsd.*proxy"):
            await second.start(30)
        proxy = cluster.procs["proxy-1"]
        proxy.kill()
        proxy.wait()
        [death] = cluster.deaths()
        assert death.startswith(f"proxy-1 (pid {proxy.pid}) exited with code -9; last lines of "
                                f"{tmp_path / 'logs' / 'proxy-1.log'}:\n    "), death
        assert "metricsd proxy" in death  # its log's tail
        assert cluster.deaths() == []  # reported once
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_child_that_dies_while_starting_fails_the_start_with_its_log_tail(tmp_path: Path) -> None:
    plan = ClusterPlan(base_port=_free_base(), stores=1, proxies=1, config_servers=1, rf=1, w=1, r=1, slots=4,
                       simulate=False, proxy_args=("--no-such-flag",))
    cluster = LocalCluster(plan, tmp_path)
    with pytest.raises(LaunchError, match=r"(?s)proxy-1 exited with code 2 during the start; last lines of .*"
                                          r"unrecognized arguments: --no-such-flag"):
        await cluster.start(120)
    assert not cluster.procs and not cluster.etcd.running  # what had started was stopped


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_child_of_a_sigkilled_cluster_up_ends_etcd_included(tmp_path: Path) -> None:
    base = _free_base()
    up = subprocess.Popen([sys.executable, "-m", "metricsd", "cluster", "up", "--plaintext", "--base-port", str(base),
                           "--stores", "2", "--config-servers", "1", "--rf", "2", "--slots", "8", "--pods", "10",
                           "--data-dir", str(tmp_path)], cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert up.stdout is not None
        out = []
        for line in up.stdout:
            out.append(line)
            if "Ctrl-C stops everything" in line:
                break
        children = _children(up.pid)
        commands = [_command(pid) for pid in children]
        assert len(children) == 7, commands  # etcd, 2 stores, a config server, 2 proxies, the agent
        assert sum("etcd" in c and "metricsd store" not in c and "--name metricsd-etcd" in c for c in commands) == 1
        up.kill()
        up.wait(10)
        for pid in children:
            wait_until_sync(f"pid {pid} ({_command(pid)}) to end with the launcher", lambda pid=pid: _gone(pid))
        plan = ClusterPlan(base_port=base, stores=2, proxies=2, config_servers=1)
        wait_until_sync("every port of the plan to be free", lambda: not taken_ports(plan.host, plan.ports()))
    finally:
        if up.poll() is None:
            up.kill()
        if up.stdout is not None:
            up.stdout.close()


# --- helpers ---------------------------------------------------------------------------------


def _free() -> int:
    return free_port()


def _free_base() -> int:
    for _ in range(100):
        base = free_range("127.0.0.1", 200)
        if not taken_ports("127.0.0.1", ClusterPlan(base_port=base, stores=3, proxies=2).ports()):
            return base
    raise AssertionError("no free port range")


def _sleep() -> str:
    for path in ("/bin/sleep", "/usr/bin/sleep"):
        if os.path.exists(path):
            return path
    pytest.skip("no sleep binary")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, not yet reaped

