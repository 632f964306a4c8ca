"""The hourly Parquet writer of a cluster, with real processes (etcd, a store, a config server, two
proxies given the same --parquet-dir): the proxies elect one writer in etcd, which writes each
closed hour once; killed with SIGKILL, the other takes over within the lease's TTL and writes the
closed hours it finds without a marker, the ones the dead writer missed included. The writers'
clock is a file the test moves (--parquet-clock-file): hours close when the test says, nobody
waits for one to pass."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_procs import Proc, Procs, free_port, wait_listening, wait_map
from polling import wait_until

from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cluster.shardmap import KeyLayout
from metricsd.onward.hourly import HOUR_MS
from metricsd.onward.parquet import hour_dir

pytestmark = pytest.mark.slow

DELAY_MS = 600_000  # the writer's default: an hour is closed ten minutes after it ends


def _set_clock(path: Path, now_ms: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{now_ms}\n")
    tmp.replace(path)


def _writer_of(out: Path, hour: int) -> str | None:
    marker = out / hour_dir("samples", hour * HOUR_MS) / "_SUCCESS"
    return json.loads(marker.read_text())["writer"] if marker.exists() else None


async def test_one_proxy_writes_each_hour_and_another_takes_over_the_missed_hours_when_it_is_killed(
        etcd_server: EtcdServer, etcd_client: Callable[[EtcdServer], EtcdKV], tmp_path: Path) -> None:
    layout = KeyLayout(root=f"/parquet-test-{uuid.uuid4().hex[:8]}", cluster="c1")
    kv = etcd_client(etcd_server)
    procs = Procs(tmp_path, etcd_server.endpoint, layout)
    out, clock = tmp_path / "pq", tmp_path / "clock"
    _set_clock(clock, HOUR_MS + DELAY_MS + 1)  # hour 0 (1970-01-01 00:00) is closed, nothing after it

    def proxy(name: str) -> Proc:
        port = free_port()
        return procs.start(name, "proxy", ["--grpc-port", str(port), "--http-port", "-1", "--w", "1", "--r", "1",
                                           "--parquet-dir", str(out), "--parquet-check", "0.1",
                                           "--parquet-clock-file", str(clock)], port)

    try:
        procs.store("store-1", ttl=2)
        procs.config_server("cs-1", slots=8, rf=1, ttl=2, min_members=1)
        await wait_map(kv, layout, lambda m: len(m.members) == 1)
        first = proxy("proxy-1")
        await wait_listening(first)
        one = f"{socket.gethostname()}:{first.port}"
        await wait_until("proxy-1 wrote hour 0", lambda: _writer_of(out, 0) == one, 30)
        second = proxy("proxy-2")
        await wait_listening(second)
        two = f"{socket.gethostname()}:{second.port}"
        _set_clock(clock, 2 * HOUR_MS + DELAY_MS + 1)  # hour 1 closes: the leader writes it, not proxy-2
        await wait_until("proxy-1 wrote hour 1", lambda: _writer_of(out, 1) == one, 30)
        first.kill9()
        _set_clock(clock, 4 * HOUR_MS + DELAY_MS + 1)  # hours 2 and 3 close while nobody leads
        await wait_until("proxy-2 took over and wrote hours 2 and 3",
                         lambda: _writer_of(out, 2) == two and _writer_of(out, 3) == two, 60)
        assert [_writer_of(out, h) for h in range(4)] == [one, one, two, two]  # each once: 0 and 1 not again
        assert "hour=00 written" not in second.output() and "hour=01 written" not in second.output()
        assert "leads; writing the closed hours" in second.output()
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.close()
