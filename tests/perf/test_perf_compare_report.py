"""The side-by-side benchmark's pure helpers: answers in one shape, the tolerance check, ratios and
the generated section of perf/RESULTS.md (perf/compare_queries.py, perf/compare_report.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "perf"))

from compare_http import _whole_measures
from compare_peers import armed, server_of
from compare_queries import compare_answers, from_aggregate, from_prometheus_json, rel_diff, summarise
from compare_report import BEGIN, END, _whole_cell, behind, loop_ab, markdown, measure, ratios, replace_section

from metricsd.proto import metricsd_pb2 as pb


def test_prometheus_vector_matrix_and_scalar_become_answers() -> None:
    vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"pod": "a"}, "value": [1700000005.0, "0.5"]},
        {"metric": {"pod": "b"}, "value": [1700000005.0, "1e-3"]}]}}
    matrix = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"pod": "a"}, "values": [[1700000005.5, "1"], [1700000035.5, "2"]]}]}}
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1700000005.0, "3"]}}
    assert from_prometheus_json(vector, "pod") == {"a": {1700000005000: 0.5}, "b": {1700000005000: 0.001}}
    assert from_prometheus_json(matrix) == {"": {1700000005500: 1.0, 1700000035500: 2.0}}
    assert from_prometheus_json(scalar) == {"": {1700000005000: 3.0}}


def test_an_error_response_is_not_an_answer() -> None:
    with pytest.raises(ValueError, match="bad_data: parse error"):
        from_prometheus_json({"status": "error", "errorType": "bad_data", "error": "parse error"})


def test_aggregate_answer_keeps_the_top_groups_and_drops_nan() -> None:
    resp = pb.AggregateResponse(timestamps=[5000], values=[0.1, 0.7, math.nan, 0.4])
    for pod in ("a", "b", "c", "d"):
        resp.groups.add().labels.add(name="pod", value=pod)
    assert from_aggregate(resp, "pod") == {"a": {5000: 0.1}, "b": {5000: 0.7}, "d": {5000: 0.4}}
    assert list(from_aggregate(resp, "pod", top=2)) == ["b", "d"]


def test_answers_agree_within_the_tolerance_and_not_beyond() -> None:
    ref = {"": {1: 1.0, 2: 2.0}}
    assert compare_answers(ref, {"": {1: 1.0 + 5e-7, 2: 2.0}}).agrees(1e-6)
    c = compare_answers(ref, {"": {1: 1.0 + 5e-6, 2: 2.0}})
    assert not c.agrees(1e-6) and c.max_rel == pytest.approx(5e-6, rel=1e-3) and c.points == 2


def test_a_missing_or_extra_point_is_a_disagreement() -> None:
    c = compare_answers({"a": {1: 1.0}, "b": {1: 2.0}}, {"a": {1: 1.0}, "c": {1: 2.0}})
    assert (c.missing, c.extra, c.agrees(1e-6)) == (["b@1"], ["c@1"], False)
    assert not compare_answers({}, {}).agrees(1e-6)  # an empty reference proves nothing


def test_relative_difference_of_zeros_and_nans() -> None:
    assert rel_diff(0.0, 0.0) == 0.0 and rel_diff(math.nan, math.nan) == 0.0
    assert rel_diff(1.0, 0.0) == 1.0 and math.isnan(rel_diff(1.0, math.nan))


def test_summary_percentiles_in_milliseconds() -> None:
    s = summarise([i / 1000 for i in range(1, 101)])
    assert (round(s["p50_ms"], 6), round(s["p99_ms"], 6), s["n"]) == (50.5, 99.01, 100)


def test_ratios_are_ours_over_the_peers_and_know_which_way_is_better() -> None:
    ms = [measure("metricsd", "ingest.live.cpu_s_per_million", 0.9, "CPU s"),
          measure("prometheus", "ingest.live.cpu_s_per_million", 4.5, "CPU s"),
          measure("metricsd", "ingest.live.samples_per_s", 100.0, "samples/s"),
          measure("victoriametrics", "ingest.live.samples_per_s", 400.0, "samples/s")]
    rs = {(r["measure"], r["peer"]): r for r in ratios(ms)}
    assert set(rs) == {("ingest.live.cpu_s_per_million", "prometheus"), ("ingest.live.samples_per_s",
                                                                          "victoriametrics")}
    assert rs[("ingest.live.cpu_s_per_million", "prometheus")]["ratio"] == pytest.approx(0.2)
    assert not behind(rs[("ingest.live.cpu_s_per_million", "prometheus")])
    assert behind(rs[("ingest.live.samples_per_s", "victoriametrics")])  # a quarter of the throughput


def test_the_section_is_replaced_between_the_markers_and_nothing_else_changes() -> None:
    text = f"# Results\n\nkept above\n\n{BEGIN}\nold table\n{END}\n\nkept below\n"
    out = replace_section(text, "new table\n")
    assert out == f"# Results\n\nkept above\n\n{BEGIN}\nnew table\n{END}\n\nkept below\n"
    assert replace_section(out, "new table") == out


def test_the_section_is_appended_when_absent_and_a_lone_marker_is_refused() -> None:
    assert replace_section("# Results\n", "t") == f"# Results\n\n{BEGIN}\nt\n{END}\n"
    with pytest.raises(ValueError, match="lone or misordered"):
        replace_section(f"x\n{END}\n{BEGIN}\n", "t")


def test_markdown_names_the_command_and_every_question() -> None:
    ms = [measure(s, "query.a.c1.p50_ms", v, "ms") for s, v in (("metricsd", 2.0), ("prometheus", 50.0))]
    ms += [measure(s, "query.a.c1.p99_ms", v, "ms") for s, v in (("metricsd", 3.0), ("prometheus", 70.0))]
    ms += [measure("metricsd", "memory.rss_mib", 300.0, "MiB"), measure("prometheus", "memory.rss_mib", 250.0, "MiB")]
    result = {
        "command": "perf/compare.py --quick", "date": "2026-01-01", "cores": 2, "duration_s": 120.0,
        "python": "3.11", "metricsd_mode": "one store", "rtol": 1e-6, "queries": 60, "warmup": 10,
        "concurrency": [1], "versions": {"metricsd": "0.1", "prometheus": "2.42", "victoriametrics": "1.79"},
        "workload": {"seed": 8, "pods": 10, "big_pods": 5, "other_workloads": 2, "series": 40, "hours": 2.0,
                     "interval_s": 10.0, "samples": 28800, "backfill_samples": 26400, "live_samples": 2400,
                     "backfill_series": 1000, "backfill_ticks": 60, "live_series": 2000},
        "questions": [{"key": "a", "title": "avg CPU utilisation"}],
        "answers": {"a": {"points": 1, "metricsd": {"max_rel": 0.0}, "victoriametrics": {
            "max_rel": 0.02, "median_rel": 0.01, "missing": []}}},
        "measures": ms, "ratios": ratios(ms),
    }
    text = markdown(result)
    assert "`perf/compare.py --quick`" in text
    assert "| (a) avg CPU utilisation | 1 | 2.00 / 3.00 | - | - | 50.0 / 70.0 | - | 0.04; - | -; -; - |" in text
    assert "RSS after ingest, MiB: metricsd 300 vs Prometheus 250 (1.20x)" in text


def test_the_cluster_column_and_its_ratio_to_victoriametrics() -> None:
    ms = [measure(s, "ingest.live.cpu_s_per_million", v, "CPU s")
          for s, v in (("metricsd", 0.6), ("metricsd-cluster", 3.0), ("prometheus", 5.0), ("victoriametrics", 1.5))]
    ms.append(measure("metricsd-cluster", "ingest.live.proxy_cpu_s_per_million", 1.0, "CPU s"))
    result = {
        "command": "perf/compare.py", "date": "2026-01-01", "cores": 2, "duration_s": 60.0, "python": "3.11",
        "metricsd_mode": "one store", "rtol": 1e-6, "queries": 1, "warmup": 1, "concurrency": [1],
        "versions": {"metricsd": "0.1", "prometheus": "2.42", "victoriametrics": "1.79"},
        "workload": {"seed": 8, "pods": 10, "big_pods": 5, "other_workloads": 2, "series": 40, "hours": 2.0,
                     "interval_s": 10.0, "samples": 28800, "backfill_samples": 26400, "live_samples": 2400,
                     "backfill_series": 1000, "backfill_ticks": 60, "live_series": 2000},
        "questions": [], "answers": {}, "measures": ms, "ratios": ratios(ms),
    }
    text = markdown(result)
    assert ("| ingest, live shape: server CPU s per million samples | 0.60 | - | 3.00 | 5.00 | 1.50 | 0.12 | 0.40 "
            "| 2.00 |") in text
    assert "| ingest, live shape: of which the cluster's proxy | - | - | 1.00 | - | - | - | - | - |" in text
    assert ("ingest, live shape: server CPU s per million samples: metricsd cluster (3 stores RF 3, a proxy) 3.00 "
            "vs VictoriaMetrics 1.50 (2.00x)") in text


def test_an_event_loop_ab_names_each_arm_and_flags_what_is_more_than_10_percent_worse() -> None:
    loops = ["asyncio", "uvloop"]
    assert [armed("metricsd-cluster", lp, loops) for lp in loops] == ["metricsd-cluster", "metricsd-cluster@uvloop"]
    assert server_of("metricsd-cluster-promql@uvloop") == "metricsd-cluster@uvloop"
    assert server_of("metricsd-promql") == "metricsd" and server_of("prometheus") == "prometheus"
    ms = [measure("metricsd-cluster-promql", "http.b.c8.cpu_ms", 1.0, "ms"),
          measure("metricsd-cluster-promql@uvloop", "http.b.c8.cpu_ms", 0.8, "ms"),
          measure("metricsd", "ingest.live.samples_per_s", 100.0, "samples/s"),
          measure("metricsd@uvloop", "ingest.live.samples_per_s", 85.0, "samples/s"),
          measure("metricsd", "freshness.ms", 2.0, "ms"),
          measure("metricsd@uvloop", "freshness.ms", 2.3, "ms"),
          measure("metricsd-rw", "memory.rss_mib", 100.0, "MiB"),  # no uvloop arm: no row
          measure("victoriametrics", "freshness.ms", 1.0, "ms")]
    rows = loop_ab(ms, loops)
    assert rows[0] == "| system | measure | asyncio | uvloop | uvloop / asyncio |"
    assert rows[2:] == ["| metricsd-cluster-promql | http.b.c8.cpu_ms | 1 | 0.8 | 0.80 |",
                        "| metricsd | ingest.live.samples_per_s | 100 | 85 | 0.85 worse |",
                        "| metricsd | freshness.ms | 2 | 2.3 | 1.15 worse |"]


def test_the_cluster_cpu_cell_says_how_its_proxy_sent_the_questions() -> None:
    spent = {"all": 1.0, "counter:whole_queries": 200.0, "counter:whole_query_cheap": 190.0,
             "counter:whole_query_spread": 12.0, "counter:whole_query_timed": 200.0,
             "counter:whole_query_timed_us": 64_000.0}
    ms = _whole_measures("metricsd-cluster-promql", "http.b.c8", spent)
    idx = {(m["system"], m["measure"]): m["value"] for m in ms}
    assert idx[("metricsd-cluster-promql", "http.b.c8.store_own_ms")] == 0.32
    assert _whole_cell(idx, "metricsd-cluster-promql", "http.b.c8") == " [cheap 190/200, spread 12, store 0.32 ms]"
    assert _whole_cell(idx, "metricsd-promql", "http.b.c8") == ""  # one store: no proxy
    assert _whole_measures("metricsd-promql", "http.b.c8", {"all": 1.0}) == []
