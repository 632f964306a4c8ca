"""A short ``metricsd chaos`` run with real processes: stores SIGKILLed (one wiped), etcd stopped, a
proxy killed, while two writers and a reader go through the proxies. Nothing acknowledged is lost,
no read fails while a quorum is up, and every slot's replicas end with equal digests."""

from __future__ import annotations

from pathlib import Path

import pytest

from metricsd.cmd.chaos import ChaosOptions, run_chaos


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_chaos_run_loses_nothing_and_replicas_converge(tmp_path: Path) -> None:
    opts = ChaosOptions(duration_s=45, seed=3, pods=30)
    report = run_chaos(opts, tmp_path)
    text = "\n".join(report.lines(opts))
    assert report.acknowledged > 1000, text
    assert report.lost == 0, text
    assert report.reads > 20 and report.reads_failed_with_quorum == 0, text
    assert report.digests_agree, text
    assert len(report.level_s) >= 2 and any("wipe" in e for e in report.events), text
    assert any("etcd" in e for e in report.events) and any("proxy" in e for e in report.events), text
    assert (tmp_path / "acked.tsv").stat().st_size > 0 and (tmp_path / "chaos.json").exists()
