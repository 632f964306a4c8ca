"""The etcd server helper: start, health, pause and resume, restart on the same data."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from metricsd.cluster.etcd_kv import EtcdKV, EtcdSettings
from metricsd.cluster.etcd_server import ONE_MEMBER_FLAGS, EtcdServer, EtcdServerError, find_etcd_binary
from metricsd.cluster.kv import KVUnavailable

EtcdClient = Callable[[EtcdServer], EtcdKV]


def test_the_binary_is_found_in_the_environment() -> None:
    assert Path(find_etcd_binary()).name == "etcd"


async def test_a_paused_etcd_fails_calls_within_the_timeout_and_answers_once_resumed(
    private_etcd: EtcdServer, etcd_client: EtcdClient
) -> None:
    kv = etcd_client(private_etcd)  # request timeout 1 s
    await kv.put("/k", b"v")
    private_etcd.pause()
    try:
        with pytest.raises(KVUnavailable, match="etcd unavailable during get '/k'"):
            await asyncio.wait_for(kv.get("/k"), 5)
    finally:
        private_etcd.resume()
    # Answers again once resumed: within a few request timeouts, as a resumed process on a busy
    # machine may take more than the client's 1 s to serve its queue.
    for attempt in range(10):
        try:
            assert await kv.get("/k") is not None
            break
        except KVUnavailable:
            if attempt == 9:
                raise


@pytest.mark.slow
def test_a_restarted_server_keeps_its_data_and_its_ports(private_etcd: EtcdServer) -> None:
    endpoint, data = private_etcd.endpoint, private_etcd.data_dir
    private_etcd.stop()
    assert not private_etcd.running and not private_etcd.healthy()
    private_etcd.start()
    assert private_etcd.endpoint == endpoint and private_etcd.data_dir == data
    assert private_etcd.healthy()


def test_a_server_that_exits_at_once_is_reported_with_its_log(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "data", binary=find_etcd_binary(), extra_args=("--no-such-flag",))
    with pytest.raises(EtcdServerError) as info:
        server.start(timeout_s=10)
    assert "exited with code" in str(info.value)
    assert "no-such-flag" in str(info.value)
    server.close()


def test_the_server_runs_with_one_members_timers_unless_told_otherwise(tmp_path: Path) -> None:
    tuned = EtcdServer(tmp_path / "a", binary=find_etcd_binary()).command()
    assert " ".join(ONE_MEMBER_FLAGS) in " ".join(tuned)
    plain = EtcdServer(tmp_path / "b", binary=find_etcd_binary(), tuning=()).command()
    assert not any(flag in plain for flag in ONE_MEMBER_FLAGS if flag.startswith("--"))


async def test_the_tuned_server_grants_the_shortest_lease_a_store_may_ask_for(etcd_server: EtcdServer) -> None:
    """The config server's lower bound on --lease-ttl is 2 s; the tuned etcd grants it as asked
    (its minimum is 1.5 election timeouts, rounded up: a longer election timeout would raise it,
    and a dead store would be noticed later)."""
    assert etcd_server.tuning == ONE_MEMBER_FLAGS
    kv = EtcdKV(EtcdSettings(endpoint=etcd_server.endpoint))
    try:
        lease = await kv.grant(2)
        assert lease.ttl == 2
        await lease.revoke()
    finally:
        await kv.close()
