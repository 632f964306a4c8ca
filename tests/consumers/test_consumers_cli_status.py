"""`metricsd hpa|vpa|overcommit`: argument parsing, the status tables, fetching the HTTP document,
and all the consumers started together on the example specs over a simulated cluster."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from consumers_data import local_store

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.cmd.consumers import add_parser, fetch_status, run
from metricsd.consumers.actuators.base import InMemoryScale
from metricsd.consumers.consumerset import start_consumers
from metricsd.consumers.statusfmt import format_status

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
# 2024-01-02 20:00 UTC: inside feed-api's 19:00-23:00 schedule.
START = 1_704_153_600_000 + 20 * 3_600_000


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metricsd")
    add_parser(p.add_subparsers(dest="command", required=True))
    return p


def test_the_subcommands_parse_a_run_and_a_status() -> None:
    args = parser().parse_args(["hpa", "--spec", "x.yaml", "--addr", "127.0.0.1:9", "--backend", "webhook",
                                "--webhook-url", "http://127.0.0.1:1/h"])
    assert (args.consumer, args.action, args.spec, args.backend) == ("hpa", None, Path("x.yaml"), "webhook")
    args = parser().parse_args(["vpa", "status", "--url", "http://127.0.0.1:7999"])
    assert (args.consumer, args.action, args.url) == ("vpa", "status", "http://127.0.0.1:7999")


def test_a_run_without_a_spec_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parser().parse_args(["overcommit"])) == 2
    assert "--spec FILE is required" in capsys.readouterr().err


HPA_DOC = {"status": {}, "history": [{
    "time": "2024-01-02T20:00:00Z", "hpa": "default/feed-api", "rule": "DesiredWithinRange",
    "inputs": {"currentReplicas": 34, "metrics": [
        {"metric": "Resource/cpu", "target": {"type": "Utilization", "value": 50.0}, "current": 62,
         "source": "live"}]},
    "result": {"desiredReplicas": 43, "minReplicas": 36, "maxReplicas": 60, "schedule": "evening-peak",
               "action": "dry-run", "alert": False},
}]}


def test_the_hpa_table_shows_replicas_bounds_and_metrics() -> None:
    lines = format_status("hpa", HPA_DOC).splitlines()
    assert lines[0].split() == ["TIME", "HPA", "RULE", "REPLICAS", "METRICS", "(current/target)", "SOURCE", "ACTION",
                                "WHY"]
    assert "34 -> 43 (36..60 evening-peak)" in lines[1]
    assert "cpu 62%/50%" in lines[1] and "dry-run" in lines[1]
    assert format_status("hpa", []) == "no hpa decisions yet"
    with pytest.raises(ValueError):
        format_status("hpa", "not a document")


async def test_status_fetches_the_http_document(port: int) -> None:
    async def handler(request: web.Request) -> web.Response:
        assert request.path == "/api/v1/metricsd/hpa"
        return web.json_response(HPA_DOC)

    app = web.Application()
    app.router.add_get("/api/v1/metricsd/hpa", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        assert await fetch_status("hpa", f"http://127.0.0.1:{port}/") == HPA_DOC
    finally:
        await runner.cleanup()


async def test_all_the_consumers_decide_on_the_simulated_cluster(tmp_path: Path) -> None:
    api, backend = local_store()
    sim = Simulator(SimConfig(), START - 3_600_000)
    ts, values = sim.block(361)  # the hour before START, as `metricsd up` backfills it
    for req in write_requests(sim, ts, values, max_samples=200_000):
        api.write(req)
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        await asyncio.Event().wait()  # park until stopped: one sync per controller

    sink = InMemoryScale()
    consumers = start_consumers(backend, ManualClock(START), EXAMPLES, sink, tmp_path, sleep=sleep)
    await consumers.start()
    for _ in range(200):
        if len(slept) == 4:
            break
        await asyncio.sleep(0)
    await consumers.stop()
    assert sorted(slept) == [15.0, 60.0, 60.0, 60.0]
    assert (tmp_path / "vpa-checkpoint.json").exists()

    hpa = consumers.document("hpa")
    by_name = {e["hpa"]: e for e in hpa["history"]}
    feed = by_name["default/feed-api"]
    assert feed["result"]["schedule"] == "evening-peak" and feed["result"]["minReplicas"] == 36
    assert feed["inputs"]["currentReplicas"] == 34 and feed["result"]["desiredReplicas"] >= 36
    # 34 is below the evening's floor: the controller records why in words, naming the schedule
    assert feed["rule"] == "BelowMinReplicas"
    assert feed["why"] == "schedule evening-peak raises the minimum from 10 to 36"
    assert {t["hpa"]: t["why"] for t in hpa["status"]["targets"]}["default/feed-api"] == feed["why"]
    assert by_name["video/comment"]["inputs"]["metrics"][0]["podsReporting"] == 9
    vpa = consumers.document("vpa")
    recs = {e["vpa"]: e["result"]["recommendation"]["containerRecommendations"] for e in vpa["history"]}
    assert [r["containerName"] for r in recs["social/recommend"]] == ["app"]
    assert recs["video/video-transcode"] and vpa["history"][1]["rule"] == "RecommendOnly"
    over = consumers.document("overcommit")
    assert over["history"][0]["rule"] == "Advised" and over["history"][0]["inputs"]["hoursOfHistory"] == 2
    colo = consumers.document("colocation")
    (entry,) = colo["history"]
    # One hour of history: no hour of tomorrow has a same hour yesterday but 23:00's, so nothing is lent.
    assert entry["rule"] == "Steady" and entry["inputs"]["nodes"] == 5
    assert [r["nodesLendable"] for r in entry["result"]["table"]].count(0) >= 23
    for kind in ("hpa", "vpa", "overcommit", "colocation"):
        doc: Any = json.loads(json.dumps(consumers.document(kind), allow_nan=False))
        assert "no " not in format_status(kind, doc)[:3]
