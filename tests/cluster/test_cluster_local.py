"""`metricsd cluster up` / `status`: the plan (pure) and one real run stopped with Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from metricsd.cluster.shardmap import KeyLayout, Member, ShardMap
from metricsd.cmd.cluster import ClusterPlan
from metricsd.cmd.cluster import add_arguments as cluster_add_arguments
from metricsd.cmd.cluster import run as cluster_run
from metricsd.cmd.proxy import add_arguments as proxy_add_arguments
from metricsd.cmd.queryflags import remote_write_argv
from metricsd.cmd.status import ClusterStatus, format_status
from metricsd.ports import free_range
from metricsd.proxy.settings import ProxySettings

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_lays_out_ports_from_the_base_and_starts_roles_in_order() -> None:
    plan = ClusterPlan(base_port=7400, stores=3, proxies=2, config_servers=2)
    specs = plan.specs()
    assert [s.name for s in specs] == ["store-1", "store-2", "store-3", "config-server-1", "config-server-2",
                                       "proxy-1", "proxy-2", "agent"]
    assert [s.grpc_port for s in specs] == [7501, 7502, 7503, 7451, 7452, 7401, 7411, None]
    assert plan.etcd_endpoint == "127.0.0.1:7479"
    agent = specs[-1].args
    assert agent[agent.index("--targets") + 1] == "127.0.0.1:7401,127.0.0.1:7411"
    config = specs[3].args
    assert config[config.index("--min-members") + 1] == "3"
    ports = [p for s in specs if s.grpc_port for p in [s.grpc_port]] + [7400, 7410, 7402, 7479, 7480]
    assert len(set(ports)) == len(ports)
    with pytest.raises(ValueError, match="--proxies"):
        ClusterPlan(proxies=6)


def test_a_secure_plan_gives_every_process_tls_and_its_own_token(tmp_path: Path) -> None:
    plan = ClusterPlan(stores=1, proxies=1, config_servers=1, security_dir=str(tmp_path))
    args = {s.name: s.args for s in plan.specs()}

    def flag(name: str, f: str) -> str | None:
        a = args[name]
        return a[a.index(f) + 1] if f in a else None

    for name in ("store-1", "proxy-1"):
        assert flag(name, "--tokens-file") == str(tmp_path / "tokens")
        assert flag(name, "--tls-client-ca") == str(tmp_path / "ca.crt")  # mutual TLS between components
    assert flag("store-1", "--auth-token-file") == str(tmp_path / "store.token")
    assert flag("proxy-1", "--auth-token-file") == str(tmp_path / "proxy.token")
    assert flag("agent", "--auth-token-file") == str(tmp_path / "agent.token")
    assert flag("config-server-1", "--tls-cert") == str(tmp_path / "metricsd.crt")
    assert flag("config-server-1", "--tokens-file") is None  # it serves health checks only
    assert "--tls-cert" not in ClusterPlan(stores=1).store_specs()[0].args  # plaintext without a security dir


def test_status_lists_members_with_their_slots_the_map_version_and_health() -> None:
    members = {m: Member(m, f"127.0.0.1:{7500 + i}") for i, m in enumerate(("s1", "s2"))}
    shard_map = ShardMap(version=4, rf=2, slots=(("s1", "s2"), ("s2", "s1"), ("s1",)), members=members)
    st = ClusterStatus(shard_map, "", {"s1": members["s1"]}, "cs-1", {"s1": "SERVING", "s2": "unreachable (X)"})
    text = format_status(st, KeyLayout())
    assert text.splitlines()[:3] == ["cluster default (/metricsd/default)", "config server leader: cs-1",
                                     "shard map: version 4, 3 slots, rf 2, 1 slots with fewer than rf replicas"]
    assert "s1      127.0.0.1:7500  active  yes                 3      2      SERVING" in text
    assert "s2      127.0.0.1:7501  active  no (lease expired)  2      1      unreachable (X)" in text


def _free_base() -> int:
    """A base port whose cluster layout (base .. base + 199) is free and outside the ephemeral range."""
    return free_range("127.0.0.1", 200)


@pytest.mark.slow
def test_cluster_up_starts_every_role_reports_status_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    base = _free_base()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    up = subprocess.Popen([sys.executable, "-m", "metricsd", "cluster", "up", "--base-port", str(base),
                           "--stores", "2", "--config-servers", "1", "--rf", "2", "--slots", "8", "--pods", "20",
                           "--data-dir", str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        assert up.stdout is not None
        banner = []
        for line in up.stdout:
            banner.append(line)
            if "Ctrl-C stops everything" in line:
                break
        assert f"proxy-1         gRPC 127.0.0.1:{base + 1}" in "".join(banner), "".join(banner)
        deadline = time.monotonic() + 20
        while True:
            status = subprocess.run([sys.executable, "-m", "metricsd", "cluster", "status", "--etcd",
                                     f"127.0.0.1:{base + 79}", "--tls-ca", str(tmp_path / "security" / "ca.crt"),
                                     "--tls-cert", str(tmp_path / "security" / "metricsd.crt"),
                                     "--tls-key", str(tmp_path / "security" / "metricsd.key")],
                                    cwd=ROOT, env=env, capture_output=True, text=True)
            if "shard map: version" in status.stdout and status.stdout.count("SERVING") == 2:
                break
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.2)
        assert "config server leader: config-server-1" in status.stdout
        _proxy_http_needs_the_ops_token(base, tmp_path / "security")
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=40)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, rest
    order = [line.split(" INFO metricsd.cluster: ")[1].split()[0] for line in rest.splitlines()
             if " stopped (exit code" in line]
    assert order == ["agent", "proxy-2", "proxy-1", "config-server-1", "store-2", "store-1"], rest
    assert all(f"{name} stopped (exit code 0)" in rest for name in order), rest


def _proxy_http_needs_the_ops_token(base: int, security: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(security / "ca.crt"))
    ctx.load_cert_chain(security / "metricsd.crt", security / "metricsd.key")
    url = f"https://127.0.0.1:{base}/api/v1/query?query=1"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, context=ctx, timeout=10)
    e.value.close()
    assert e.value.code == 401
    token = (security / "ops.token").read_text().strip()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        assert resp.status == 200


def _up_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cluster_add_arguments(p)
    return p.parse_args(["up", *argv])


def test_cluster_up_hands_the_remote_write_flags_to_every_proxy(tmp_path: Path) -> None:
    rules = tmp_path / "relabel.yaml"
    rules.write_text("- source_labels: [job]\n  target_label: namespace\n", encoding="utf-8")
    args = _up_args("--remote-write-relabel", str(rules), "--remote-write.default-namespace", "infra",
                    "--remote-write.pod-from", "instance", "--remote-write.created-timestamp-zero")
    plan = ClusterPlan(stores=1, proxies=2, config_servers=1, proxy_args=remote_write_argv(args))
    proxies = plan.proxy_specs()
    assert len(proxies) == 2
    for spec in proxies:
        a = spec.args
        assert a[a.index("--remote-write-relabel") + 1] == str(rules.resolve())
        assert a[a.index("--remote-write.default-namespace") + 1] == "infra"
        assert a[a.index("--remote-write.pod-from") + 1] == "instance"
        assert "--remote-write.created-timestamp-zero" in a
        # what the proxy's own parser makes of them: the same settings as if given to it directly
        p = argparse.ArgumentParser()
        proxy_add_arguments(p)
        parsed = p.parse_args(list(a))
        assert parsed.rw_default_namespace == "infra" and parsed.rw_pod_from == "instance"
        assert parsed.remote_write_relabel == rules.resolve() and parsed.rw_created_zero
    assert all("--remote-write-relabel" not in s.args for s in plan.store_specs())


def test_cluster_up_refuses_a_bad_relabel_file_before_starting_anything(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "relabel.yaml"
    bad.write_text("- action: explode\n", encoding="utf-8")
    assert cluster_run(_up_args("--remote-write-relabel", str(bad), "--base-port", "7400")) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "explode" in err
    assert cluster_run(_up_args("--remote-write-relabel", str(tmp_path / "missing.yaml"))) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_cluster_up_hands_write_linger_to_every_proxy_and_refuses_a_bad_one(capsys: pytest.CaptureFixture[str]) -> None:
    from metricsd.cmd.cluster import proxies_argv

    plan = ClusterPlan(stores=1, proxies=2, config_servers=1, proxy_args=proxies_argv(_up_args("--write-linger", "25")))
    p = argparse.ArgumentParser()
    proxy_add_arguments(p)
    for spec in plan.proxy_specs():
        assert p.parse_args(list(spec.args)).write_linger == 25.0
    assert all("--write-linger" not in s.args for s in plan.store_specs())
    assert "--write-linger" not in proxies_argv(_up_args())  # not given: the proxy's own default
    for flags, on in ((("--writes-on-read-port",), True), (("--no-writes-on-read-port",), False), ((), True)):
        plan = ClusterPlan(stores=1, proxies=1, config_servers=1, proxy_args=proxies_argv(_up_args(*flags)))
        assert p.parse_args(list(plan.proxy_specs()[0].args)).writes_on_read_port is on
    assert cluster_run(_up_args("--write-linger", "1001", "--base-port", "7400")) == 2
    assert "--write-linger" in capsys.readouterr().err


def test_cluster_up_hands_the_spill_to_every_proxy_and_refuses_a_bad_one(capsys: pytest.CaptureFixture[str]) -> None:
    from metricsd.cmd.cluster import proxies_argv

    p = argparse.ArgumentParser()
    proxy_add_arguments(p)
    spill = proxies_argv(_up_args("--spill-in-flight", "8"))
    plan = ClusterPlan(stores=1, proxies=2, config_servers=1, proxy_args=spill)
    assert [p.parse_args(list(spec.args)).spill_in_flight for spec in plan.proxy_specs()] == [8, 8]
    assert all("--spill-in-flight" not in s.args for s in plan.store_specs())
    plan = ClusterPlan(stores=1, proxies=1, config_servers=1, proxy_args=proxies_argv(_up_args()))
    assert p.parse_args(list(plan.proxy_specs()[0].args)).spill_in_flight == ProxySettings.whole_spill  # its own
    assert cluster_run(_up_args("--spill-in-flight", "0", "--base-port", "7400")) == 2
    assert "--spill-in-flight" in capsys.readouterr().err


async def test_cluster_up_is_woken_by_a_child_that_ends_and_not_before() -> None:
    import asyncio

    from metricsd.cmd.cluster import watch_exits

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # ended and reaped: its pid names nothing
    exited = asyncio.Event()
    unwatch = watch_exits([child.pid], exited)
    assert unwatch is not None  # Linux with pidfds
    try:
        await asyncio.sleep(0.3)
        assert not exited.is_set()
        child.kill()
        await asyncio.wait_for(exited.wait(), 10)
    finally:
        unwatch()
        child.wait()
    already = asyncio.Event()
    unwatch_gone = watch_exits([gone.pid], already)
    assert already.is_set()
    assert unwatch_gone is not None
    unwatch_gone()
