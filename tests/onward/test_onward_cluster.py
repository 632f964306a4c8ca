"""`metricsd cluster up --remote-write-url`: a real cluster (etcd, two stores with RF 2, two
proxies each with the target, the simulated agent writing through them) sends every sample its
agent wrote to a real VictoriaMetrics once: a sample passes through one proxy and is queued there
once, and the RF copies below the proxies never go onward. VictoriaMetrics keeps a sample sent
twice twice (no deduplication is configured), so equal counts per series mean once each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from onward_peers import VICTORIA_METRICS, metric_values, query, running, victoria_metrics, vm_flush, wait_for
from processes import stop_process

from metricsd.ports import free_range

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VICTORIA_METRICS is None, reason="victoria-metrics is not installed: run `make "
                                                        "victoria-metrics-deps` (apt-get, as root)"),
]


def _free_base() -> int:
    """A base port whose cluster layout (base .. base + 199) is free and outside the ephemeral range."""
    return free_range("127.0.0.1", 200)


def _onward(url: str) -> dict[str, dict[str, float]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {name: metric_values(text, f"metricsd_onward_{name}") for name in
            ("samples_sent_total", "samples_pending", "lag_seconds", "samples_failed_total",
             "samples_dropped_total", "samples_queued_total")}


def _samples(url: str, at_s: float) -> dict[tuple[tuple[str, str], ...], list[tuple[float, str]]]:
    """Every raw sample of the 10 minutes before ``at_s``, by series."""
    return {tuple(sorted(r["metric"].items())): [(float(t), v) for t, v in r["values"]]
            for r in query(url, '{__name__=~".+", namespace!=""}[10m]', at_s)}


def test_cluster_up_sends_every_sample_the_agent_wrote_to_victoria_metrics_once(tmp_path: Path) -> None:
    vm = victoria_metrics(tmp_path / "vm")
    base = _free_base()
    proxies = [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 10}"]
    data = tmp_path / "cluster"
    logs = [data / "logs" / f"{n}.log" for n in ("proxy-1", "proxy-2", "agent")]
    with running(vm):
        up = subprocess.Popen(
            [sys.executable, "-m", "metricsd", "cluster", "up", "--plaintext", "--base-port", str(base),
             "--stores", "2", "--proxies", "2", "--config-servers", "1", "--rf", "2", "--slots", "8",
             "--pods", "20", "--data-dir", str(data), "--remote-write-url", vm.url + "/api/v1/write"],
            cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT)
        try:
            # The agent writes through a proxy (the other is its fail-over), 180 series a tick
            # stamped with the time of the tick: five ticks queued to go on.
            wait_for("five ticks queued", lambda: sum(
                sum(_onward(u)["samples_queued_total"].values()) for u in proxies) >= 5 * 180, logs, 180)
            # Samples up to `at` (three ticks or more) were written by now; once neither proxy has
            # anything queued for longer than a few seconds, every one of them was sent.
            at = time.time() - 12
            wait_for("both proxies caught up", lambda: all(
                max(_onward(u)["lag_seconds"].values(), default=99) < 5 for u in proxies), logs, 60)
            vm_flush(vm)
            ours = _samples(proxies[0], at)
            theirs = wait_for("VictoriaMetrics has every series", lambda: (
                got if len(got := _samples(vm.url, at)) >= len(ours) else None), [vm.log], 30)
            assert len(ours) >= 100 and sum(len(v) for v in ours.values()) >= 2 * len(ours)  # ticks, not one
            assert theirs == ours  # every series, each sample once: not twice (two proxies, RF 2), not lost
            for u in proxies:
                m = _onward(u)
                assert len(m["samples_pending"]) == 1, m  # each proxy has the target
                assert not any(m["samples_failed_total"].values()) and not any(m["samples_dropped_total"].values())
        finally:
            up.send_signal(signal.SIGINT)  # cluster up stops every process it started
            try:
                up.wait(60)
            finally:
                stop_process(up)
