"""Every panel of deploy/grafana/*.json against a populated metricsd, queried as Grafana's Prometheus
data source queries: template variables resolved by their `label_values()` query through
/api/v1/label/<name>/values with match[] (cross-checked with /api/v1/series), then every target
sent to /api/v1/query_range by POST form with start/end in unix seconds, and each must answer
with data. `metricsd up` runs as a real process with the consumer specs of deploy/examples/, so the
HPA, VPA, overcommit and colocation series the dashboards draw are published by the consumers
themselves."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grafana_dashboards import STEP_S, label_values, load, panels, query_variables, substitute, variable_query

from metricsd.cluster.etcd_server import free_port

BIN = Path(sys.executable).parent / "metricsd"
EXAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "examples"
CONSUMERS = ("hpa", "vpa", "overcommit", "colocation")


def _call(url: str, path: str, form: dict[str, str | list[str]] | None = None) -> dict[str, Any]:
    """GET, or POST application/x-www-form-urlencoded with repeated keys for lists, as Grafana sends."""
    data = urllib.parse.urlencode(form, doseq=True).encode() if form is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if form is not None else "GET")
    if data is not None:
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            body: dict[str, Any] = json.load(r)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path} {form}: HTTP {e.code}: {e.read()[:500]!r}") from None
    assert body["status"] == "success", body
    return body


@pytest.fixture(scope="module")
def metricsd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    http_port, grpc_port = free_port(), free_port()
    log = (tmp_path_factory.mktemp("up") / "up.log").open("w")
    proc = subprocess.Popen(
        [str(BIN), "up", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port),
         "--examples-dir", str(EXAMPLES), "--pods", "60", "--workloads", "10", "--nodes", "5"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 120
        published: dict[str, int] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                for kind in CONSUMERS:
                    with urllib.request.urlopen(f"{url}/api/v1/metricsd/{kind}", timeout=10) as r:
                        published[kind] = json.load(r)["publishing"]["samples"]
            except (urllib.error.URLError, ConnectionError):
                pass
            if len(published) == len(CONSUMERS) and all(published.values()):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"metricsd up exited with {proc.returncode}"
        assert published and all(published.values()), f"not every consumer published its decisions: {published}"
        # Grafana ends a range query at now rounded down to the step: a sample younger than that is
        # not drawn yet, in Grafana as here. Every decision so far is at or before now, so wait for
        # the next step boundary (not a whole step).
        next_boundary = (time.time() // STEP_S + 1) * STEP_S
        time.sleep(max(0.0, next_boundary - time.time()) + 0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            log.close()


def _variable_values(url: str, board: dict[str, Any], start: float, end: float) -> list[dict[str, str]]:
    """Every combination of the query variables' values, each variable's query interpolated with the
    values of those before it, answered as Grafana asks: /api/v1/label/<label>/values?match[]=..."""
    combos: list[dict[str, str]] = [{"datasource": "metricsd"}]
    for var in query_variables(board):
        out = []
        for values in combos:
            selector, label = label_values(substitute(variable_query(var), values))
            params = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
            if selector is not None:
                params["match[]"] = selector
            found = _call(url, f"/api/v1/label/{label}/values?{urllib.parse.urlencode(params)}")["data"]
            assert found, f"{board['title']}: variable {var['name']} has no values ({selector}, {label})"
            if selector is not None:  # the same answer through /api/v1/series, Grafana's other way
                series = _call(url, "/api/v1/series", {"match[]": [selector], "start": params["start"],
                                                       "end": params["end"]})["data"]
                assert sorted({s[label] for s in series if label in s}) == found
            out += [{**values, var["name"]: v} for v in found]
        combos = out
    return combos


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(load()))
def test_every_panel_of_the_dashboard_draws_data_from_metricsd(metricsd: str, name: str) -> None:
    board = load()[name]
    end = time.time()
    start = end - 3600
    combos = _variable_values(metricsd, board, start, end)
    assert combos
    # Grafana aligns a range query's start and end to its step
    form_start, form_end = str(int(start // STEP_S * STEP_S)), str(int(end // STEP_S * STEP_S))
    empty = []
    for values, panel in itertools.product(combos, panels(board)):
        for target in panel["targets"]:
            expr = substitute(target["expr"], values)
            body = _call(metricsd, "/api/v1/query_range", {"query": expr, "start": form_start, "end": form_end,
                                                            "step": str(STEP_S)})
            data = body["data"]
            assert data["resultType"] == "matrix"
            if not any(series["values"] for series in data["result"]):
                empty.append(f"{panel['title']!r} {target['refId']} with {values}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
