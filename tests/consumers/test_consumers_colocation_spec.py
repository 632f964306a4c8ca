"""Reading ColocationPlan specs: the example file, the defaults, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from metricsd.consumers.colocation.spec import load_colocation_yaml, parse_colocation
from metricsd.consumers.specfields import SpecError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "colocation.yaml"
MIN = 60_000


def test_the_example_reads_whole() -> None:
    (spec,) = load_colocation_yaml(EXAMPLE.read_text())
    assert spec.name == "sim" and not spec.evict
    (pool,) = spec.pools
    assert pool.keep_online == 2
    names = ["sim-worker-3", "sim-worker-1", "sim-gpu-1", "sim-worker-1x"]
    assert pool.select(names) == ("sim-worker-1", "sim-worker-3")
    t = spec.settings.timing
    assert (t.drain_ms, t.notice_ms, t.return_grace_ms, t.min_lend_ms, t.min_online_ms, t.interval_ms) == (
        10 * MIN, 15 * MIN, 5 * MIN, 120 * MIN, 30 * MIN, 60_000)
    assert spec.settings.margin == 0.25 and spec.settings.surge_notice_ms == 60_000
    (curve,) = spec.curves
    assert (curve.namespace, curve.hpa, curve.pool, curve.cores_per_replica) == ("default", "feed-api", "shared", 0.25)
    (rule,) = spec.surge
    assert (rule.name, rule.service, rule.threshold, rule.nodes, rule.order) == (
        "feed-spike", "default/feed-api", 8.0, 2, "newestLent")
    assert spec.surge_services == {"feed-spike": ("default", "feed-api")}
    assert spec.marks.lent_taint == "metricsd.io/lent"


def test_a_minimal_spec_takes_the_defaults() -> None:
    spec = parse_colocation({"kind": "ColocationPlan", "spec": {"pools": [{"name": "a", "nodes": ["n1", "n2"]}],
                                                                "utcOffset": 480}})
    assert spec.pools[0].select(["x"]) == ("n1", "n2")
    assert spec.settings.timing.min_lend_ms == 120 * MIN and spec.settings.utc_offset_minutes == 480
    assert spec.marks.state_label == "metricsd.io/colocation-state" and spec.interval_s == 60.0


BASE = {"pools": [{"name": "a", "nodes": ["n1"]}]}


@pytest.mark.parametrize(("spec", "path", "message"), [
    ({}, "spec.pools", "at least one pool"),
    ({"pools": [{"name": "a"}]}, "spec.pools[0]", "exactly one of nodes, nodeRegex"),
    ({"pools": [{"name": "a", "nodes": ["n"], "nodeRegex": "n.*"}]}, "spec.pools[0]", "exactly one of"),
    ({"pools": [{"name": "a", "nodeRegex": "("}]}, "spec.pools[0].nodeRegex", "not a regular expression"),
    ({"pools": [{"name": "a", "nodes": ["n"]}, {"name": "a", "nodes": ["m"]}]}, "spec.pools[1].name", "twice"),
    ({"pools": [{"name": "a", "nodes": ["n"]}, {"name": "b", "nodes": ["n"]}]}, "spec.pools[1].nodes",
     "already in pool 'a'"),
    ({"pools": [{"name": "a", "nodes": ["n"], "keepOnline": -1}]}, "spec.pools[0].keepOnline", ">= 0"),
    ({**BASE, "margin": "lots"}, "spec.margin", "number or quantity"),
    ({**BASE, "minLendMinutes": -5}, "spec.minLendMinutes", ">= 0"),
    ({**BASE, "drainMinutes": 0}, "spec.drainMinutes", ">="),
    ({**BASE, "drain": "kill"}, "spec.drain", "one of wait, evict"),
    ({**BASE, "noticeMinuts": 5}, "spec.noticeMinuts", "unknown field"),
    ({**BASE, "replicaCurves": [{"hpa": "web", "pool": "a", "coresPerReplica": 1}]}, "spec.replicaCurves[0].hpa",
     "namespace/name"),
    ({**BASE, "replicaCurves": [{"hpa": "s/web", "pool": "b", "coresPerReplica": 1}]},
     "spec.replicaCurves[0].pool", "names no pool"),
    ({**BASE, "replicaCurves": [{"hpa": "s/web", "pool": "a"}]}, "spec.replicaCurves[0].coresPerReplica",
     "is required"),
    ({**BASE, "surge": [{"name": "x", "service": {"namespace": "s", "workload": "w"}, "threshold": 1, "pool": "a",
                         "nodes": 0}]}, "spec.surge[0].nodes", ">= 1"),
    ({**BASE, "surge": [{"name": "x", "service": {"namespace": "s"}, "threshold": 1, "pool": "a", "nodes": 1}]},
     "spec.surge[0].service.workload", "is required"),
    ({**BASE, "surge": [{"name": "x", "service": {"namespace": "s", "workload": "w"}, "threshold": 1, "pool": "a",
                         "nodes": 1, "order": "random"}]}, "spec.surge[0].order", "one of newestLent"),
    ({**BASE, "nodeMarks": {"lentTaint": "bad key!"}}, "spec.nodeMarks.lentTaint", "label key"),
    ({**BASE, "nodeMarks": {"returnTaint": "metricsd.io/lent"}}, "spec.nodeMarks.returnTaint", "differ"),
    ({**BASE, "utcOffset": "8h"}, "spec.utcOffset", "+08:00"),
    ({"pools": [{"name": f"p{i}", "nodes": [f"n{i}"]} for i in range(101)]}, "spec.pools", "at most 100 pools"),
    ({"pools": [{"name": "a", "nodes": [f"n{i}" for i in range(10_001)]}]}, "spec.pools[0].nodes",
     "at most 10000 nodes"),
    ({**BASE, "surge": [{}] * 101}, "spec.surge", "at most 100 entries"),
    ({"pools": [{"name": "a", "nodeRegex": "x" * 1001}]}, "spec.pools[0].nodeRegex", "at most 1000 characters"),
    ({**BASE, "intervalSeconds": 0}, "spec.intervalSeconds", ">= 1.0"),
    ({**BASE, "margin": -0.1}, "spec.margin", ">= 0.0"),
])
def test_a_bad_spec_names_the_field(spec: dict[str, object], path: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_colocation({"kind": "ColocationPlan", "spec": spec})
    assert err.value.path == path and message in err.value.message


def test_errors_in_a_file_name_the_document() -> None:
    text = "kind: Deployment\n---\nkind: ColocationPlan\nspec: {pools: [{name: a, nodes: [n], keepOnline: x}]}\n"
    with pytest.raises(SpecError, match=r"^documents\[1\]\.spec\.pools\[0\]\.keepOnline: must be an integer"):
        load_colocation_yaml(text)
    with pytest.raises(SpecError, match=r"^documents\[0\]\.spec: is required"):
        load_colocation_yaml("kind: ColocationPlan\n")
    with pytest.raises(yaml.YAMLError):
        load_colocation_yaml("spec: [")
