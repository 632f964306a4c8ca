from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import (
    CPU_USAGE,
    LIMITS,
    METRICS,
    NODE_ALLOCATABLE,
    NODE_CAPACITY,
    OOM_EVENTS,
    REQUESTS,
    RSS,
    WORKING_SET,
    SimConfig,
    Simulator,
)
from metricsd.model import metric_name, series_id, validate_labels
from metricsd.proto import metricsd_pb2 as pb

WEDNESDAY = 1_704_844_800_000  # 2024-01-10T00:00:00Z
SATURDAY = WEDNESDAY + 3 * 86_400_000
HOUR = 3_600_000
POD_CHARS = "[bcdfghjklmnpqrstvwxz2456789]"  # Kubernetes' generated-name alphabet


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


@pytest.fixture(scope="module")
def day() -> tuple[Simulator, np.ndarray, np.ndarray]:
    """A simulated Wednesday at one sample a minute, 00:00 to 24:00 inclusive."""
    sim = Simulator(SimConfig(pods=200, interval_ms=60_000, seed=7), WEDNESDAY)
    ts, values = sim.block(24 * 60 + 1)
    return sim, ts, values


def hourly_cpu_cores(sim: Simulator, ts: np.ndarray, values: np.ndarray, hour: int) -> float:
    """Total CPU cores used in one UTC hour, from counter increases (restarts left out)."""
    cpu = values[:, sim.columns(CPU_USAGE)]
    inc = np.diff(cpu, axis=0)
    rate = np.where(inc >= 0, inc, np.nan) / (np.diff(ts)[:, None] / 1000.0)
    hours = (ts[1:] % 86_400_000) // HOUR
    return float(np.nanmean(np.nansum(rate, axis=1)[hours == hour]))


def test_same_seed_and_start_give_the_same_bits() -> None:
    a = Simulator(SimConfig(pods=30, seed=3, jitter_ms=900), WEDNESDAY + 12_345)
    b = Simulator(SimConfig(pods=30, seed=3, jitter_ms=900), WEDNESDAY + 12_345)
    ta, va = a.block(40)
    tb, vb = b.block(40)
    assert a.series == b.series
    assert a.pods() == b.pods()
    assert np.array_equal(ta, tb)
    assert np.array_equal(bits(va), bits(vb))


def test_a_different_seed_gives_different_pods_and_values() -> None:
    a = Simulator(SimConfig(pods=30, seed=1), WEDNESDAY)
    b = Simulator(SimConfig(pods=30, seed=2), WEDNESDAY)
    assert [p.pod for p in a.pods()] != [p.pod for p in b.pods()]
    va, vb = a.block(5)[1], b.block(5)[1]
    cpu = a.columns(CPU_USAGE)
    assert not np.array_equal(va[:, cpu], vb[:, cpu])


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=5))
def test_values_do_not_depend_on_how_generation_is_split(cuts: list[int]) -> None:
    config = SimConfig(pods=12, workloads=3, nodes=2, containers=2, seed=5, jitter_ms=2_000)
    whole_ts, whole = Simulator(config, WEDNESDAY).block(sum(cuts) + 3)
    sim = Simulator(config, WEDNESDAY)
    parts_ts: list[np.ndarray] = []
    parts: list[np.ndarray] = []
    for i, n in enumerate(cuts):
        if i % 2:
            ts, values = sim.block(n)
            parts_ts.append(ts)
            parts.append(values)
        else:
            for _ in range(n):
                t, row = sim.next_tick()
                parts_ts.append(np.array([t]))
                parts.append(row[np.newaxis, :])
    end = int(whole_ts[-1])
    for t, row in sim.ticks_until(end):
        parts_ts.append(np.array([t]))
        parts.append(row[np.newaxis, :])
    assert np.array_equal(np.concatenate(parts_ts), whole_ts)
    assert np.array_equal(bits(np.concatenate(parts)), bits(whole))


def test_ticks_start_aligned_and_fall_on_interval_multiples() -> None:
    sim = Simulator(SimConfig(pods=5, interval_ms=15_000), WEDNESDAY + 14_999)
    assert sim.next_timestamp_ms == WEDNESDAY
    ts, _ = sim.block(10)
    assert ts.tolist() == [WEDNESDAY + 15_000 * i for i in range(10)]
    assert [t for t, _ in sim.ticks_until(WEDNESDAY + 15_000 * 12 - 1)] == [WEDNESDAY + 150_000, WEDNESDAY + 165_000]


def test_jitter_delays_each_tick_by_at_most_jitter_ms() -> None:
    sim = Simulator(SimConfig(pods=5, interval_ms=10_000, jitter_ms=700), WEDNESDAY)
    ts, _ = sim.block(200)
    late = ts - (WEDNESDAY + 10_000 * np.arange(200))
    assert late.min() >= 0 and late.max() <= 700
    assert len(set(late.tolist())) > 50
    assert bool(np.all(np.diff(ts) > 0))


def test_counters_only_decrease_when_an_oom_kill_restarts_the_container(day: tuple) -> None:
    sim, _, values = day
    cpu = np.diff(values[:, sim.columns(CPU_USAGE)], axis=0)
    oom = np.diff(values[:, sim.columns(OOM_EVENTS)], axis=0)
    assert oom.min() == 0 and oom.max() == 1
    restarted = oom == 1
    assert bool(np.all((cpu < 0) == restarted))
    assert bool(np.all(cpu[~restarted] > 0))


def test_cpu_counter_has_microsecond_resolution(day: tuple) -> None:
    sim, _, values = day
    cpu = values[:, sim.columns(CPU_USAGE)]
    usec = np.rint(cpu * 1e6)
    assert np.array_equal(bits(usec / 1e6), bits(cpu))


def test_memory_is_whole_pages_rss_within_working_set_within_limit(day: tuple) -> None:
    sim, _, values = day
    ws = values[:, sim.columns(WORKING_SET)]
    rss = values[:, sim.columns(RSS)]
    limit = values[:, sim.columns(LIMITS)][:, ws.shape[1] :]
    assert bool(np.all(ws % 4096 == 0)) and bool(np.all(rss % 4096 == 0))
    assert bool(np.all(rss > 0)) and bool(np.all(rss <= ws))
    assert bool(np.all(ws <= limit))


def test_an_oom_kill_drops_the_working_set(day: tuple) -> None:
    sim, _, values = day
    ws = values[:, sim.columns(WORKING_SET)]
    oom = np.diff(values[:, sim.columns(OOM_EVENTS)], axis=0) == 1
    before, after = ws[:-1][oom], ws[1:][oom]
    assert len(before) > 0
    assert bool(np.all(after < 0.9 * before))


def test_oom_kills_happen_at_a_plausible_low_rate(day: tuple) -> None:
    sim, _, values = day
    oom = values[:, sim.columns(OOM_EVENTS)]
    kills = int((oom[-1] - oom[0]).sum())
    containers = oom.shape[1]
    assert 1 <= kills <= 0.2 * containers  # some, but far from every container every day
    assert int(np.count_nonzero(oom[-1] - oom[0])) >= 1


def test_requests_and_limits_are_constant_and_match_the_pods(day: tuple) -> None:
    sim, _, values = day
    fixed = values[:, 4 * len(sim.pods()) :]
    assert bool(np.all(fixed == fixed[0]))
    n = len(sim.pods())
    req, lim = values[0, sim.columns(REQUESTS)], values[0, sim.columns(LIMITS)]
    cpu_req, mem_req, cpu_lim, mem_lim = req[:n], req[n:], lim[:n], lim[n:]
    assert bool(np.all((cpu_req >= 0.25) & (cpu_req <= 2.0)))
    assert bool(np.all((mem_req >= 256 * 2**20) & (mem_req <= 4 * 2**30)))
    assert bool(np.all((cpu_lim >= 1.5 * cpu_req - 0.0005) & (cpu_lim <= 2.0 * cpu_req + 0.0005)))
    assert bool(np.all((mem_lim >= 1.5 * mem_req) & (mem_lim <= 2.0 * mem_req)))
    by_workload: dict[str, set[tuple[float, float]]] = defaultdict(set)
    for i, pod in enumerate(sim.pods()):
        (c,) = pod.containers
        assert (c.cpu_request_cores, c.memory_request_bytes) == (cpu_req[i], mem_req[i])
        assert (c.cpu_limit_cores, c.memory_limit_bytes) == (cpu_lim[i], mem_lim[i])
        by_workload[pod.workload].add((c.cpu_request_cores, c.memory_request_bytes))
    assert all(len(v) == 1 for v in by_workload.values())
    assert len({v.pop() for v in by_workload.values()}) > 1


def test_usage_follows_the_daily_tide_peaking_in_the_evening(day: tuple) -> None:
    sim, ts, values = day
    evening = hourly_cpu_cores(sim, ts, values, 21)
    night = hourly_cpu_cores(sim, ts, values, 4)
    noon = hourly_cpu_cores(sim, ts, values, 12)
    assert evening > 2.0 * night
    assert night < noon < evening


def test_weekends_are_busier_than_weekdays() -> None:
    config = SimConfig(pods=200, interval_ms=60_000, seed=11)
    results = []
    for day_ms in (WEDNESDAY, SATURDAY):
        sim = Simulator(config, day_ms + 20 * HOUR)
        ts, values = sim.block(121)
        results.append(hourly_cpu_cores(sim, ts, values, 21))
    assert results[1] > 1.08 * results[0]


def test_labels_are_valid_and_complete() -> None:
    sim = Simulator(SimConfig(pods=40, workloads=4, nodes=3, containers=2, cluster="east-1"), WEDNESDAY)
    series = sim.series
    assert len(series) == 8 * 40 * 2 + 4 * 3
    assert len(set(series)) == len(series)
    assert len({series_id(s) for s in series}) == len(series)
    assert sim.series_ids.tolist() == [series_id(s) for s in series]
    for labels in series:
        validate_labels(labels)
        d = dict(labels)
        assert d["cluster"] == "east-1"
        if d["__name__"].startswith("kube_node_"):
            assert d["namespace"] == "kube-system" and d["pod"] == f"node-{d['node']}"
            assert "container" not in d and "workload" not in d
        else:
            assert {"namespace", "pod", "container", "node", "workload"} <= d.keys()
            assert re.fullmatch(re.escape(d["workload"]) + rf"-{POD_CHARS}{{10}}-{POD_CHARS}{{5}}", d["pod"])
        if "resource" in d:
            assert (d["resource"], d["unit"]) in {("cpu", "core"), ("memory", "byte")}
    assert {dict(s)["container"] for s in series if "container" in dict(s)} == {"app", "istio-proxy"}


def test_columns_cover_every_series_in_metric_order() -> None:
    sim = Simulator(SimConfig(pods=10, nodes=2), WEDNESDAY)
    end = 0
    for metric in METRICS:
        cols = sim.columns(metric)
        assert cols.start == end
        assert {metric_name(s) for s in sim.series[cols]} == {metric}
        end = cols.stop
    assert end == len(sim.series)
    assert len(sim.next_tick()[1]) == end


def test_pods_are_unique_sorted_and_spread_over_nodes() -> None:
    sim = Simulator(SimConfig(pods=500, workloads=7, nodes=6, namespaces=4), WEDNESDAY)
    pods = sim.pods()
    keys = [p.key for p in pods]
    assert keys == sorted(keys) and len(set(keys)) == 500
    per_node = Counter(p.node for p in pods)
    assert len(per_node) == 6 and max(per_node.values()) - min(per_node.values()) <= 1
    assert len({p.namespace for p in pods}) == 4
    assert len({p.workload for p in pods}) == 7


def test_requests_on_a_node_fit_in_its_allocatable() -> None:
    sim = Simulator(SimConfig(pods=300, nodes=4, containers=2), WEDNESDAY)
    row = sim.next_tick()[1]
    cap, alloc = row[sim.columns(NODE_CAPACITY)], row[sim.columns(NODE_ALLOCATABLE)]
    assert bool(np.all(alloc < cap)) and bool(np.all(alloc > 0.85 * cap))
    cpu: defaultdict[str, float] = defaultdict(float)
    mem: Counter[str] = Counter()
    for p in sim.pods():
        cpu[p.node] += p.cpu_request_cores
        mem[p.node] += p.memory_request_bytes
    for k, node in enumerate(sim.node_names):
        assert cpu[node] <= alloc[k] and mem[node] <= alloc[4 + k]


def test_big_workload_gets_its_pods_in_default() -> None:
    sim = Simulator(SimConfig(pods=300, workloads=4, big_workload_pods=200), WEDNESDAY)
    per_workload = Counter((p.namespace, p.workload) for p in sim.pods())
    assert per_workload[("default", "big")] == 200
    assert len(per_workload) == 4 and min(per_workload.values()) >= 1
    assert sum(per_workload.values()) == 300


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pods": 0},
        {"nodes": 0},
        {"interval_ms": 0},
        {"jitter_ms": 10_000},
        {"jitter_ms": -1},
        {"big_workload_pods": 201},
        {"big_workload_pods": 100, "workloads": 1},
        {"cluster": ""},
        {"seed": -1},
    ],
)
def test_bad_configs_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="SimConfig"):
        SimConfig(**kwargs)


def decode(requests: list[pb.WriteRequest]) -> tuple[dict[int, list[tuple[int, float]]], dict[int, tuple]]:
    samples: dict[int, list[tuple[int, float]]] = defaultdict(list)
    labels: dict[int, tuple] = {}
    for req in requests:
        req = pb.WriteRequest.FromString(req.SerializeToString())
        assert sum(req.counts) == len(req.timestamps) == len(req.values)
        i = 0
        for sid, n in zip(req.ids, req.counts, strict=True):
            samples[sid].extend(zip(req.timestamps[i : i + n], req.values[i : i + n], strict=True))
            i += n
        for entry in req.series:
            labels[entry.id] = tuple((lab.name, lab.value) for lab in entry.labels)
    return samples, labels


@pytest.mark.parametrize("max_samples", [1, 7, 100, 10_000])
def test_write_requests_round_trip_a_block(max_samples: int) -> None:
    sim = Simulator(SimConfig(pods=6, nodes=2, jitter_ms=300), WEDNESDAY)
    ts, values = sim.block(9)
    wanted = {0, 5, len(sim.series) - 1}
    requests = write_requests(sim, ts, values, max_samples=max_samples, send_labels_for=wanted)
    assert all(len(r.values) <= max(max_samples, 1) for r in requests)
    samples, labels = decode(requests)
    assert len(samples) == len(sim.series)
    for i, sid in enumerate(sim.series_ids.tolist()):
        got = samples[sid]
        assert [t for t, _ in got] == ts.tolist()
        assert np.array_equal(bits(np.array([v for _, v in got])), bits(values[:, i]))
    assert labels == {series_id(sim.series[i]): sim.series[i] for i in wanted}


def test_write_requests_of_one_tick_send_every_label_by_default_and_none_when_asked() -> None:
    sim = Simulator(SimConfig(pods=4, nodes=1), WEDNESDAY)
    ts, row = sim.next_tick()
    samples, labels = decode(write_requests(sim, ts, row, max_samples=5))
    assert labels == {series_id(s): s for s in sim.series}
    assert {sid: got for sid, got in samples.items()} == {
        sid: [(ts, float(v))] for sid, v in zip(sim.series_ids.tolist(), row.tolist(), strict=True)
    }
    assert decode(write_requests(sim, ts, row, send_labels_for=set()))[1] == {}


def test_write_requests_refuse_mismatched_shapes() -> None:
    sim = Simulator(SimConfig(pods=4, nodes=1), WEDNESDAY)
    ts, values = sim.block(3)
    with pytest.raises(ValueError, match="do not match"):
        write_requests(sim, ts[:2], values)
    with pytest.raises(ValueError, match="do not match"):
        write_requests(sim, ts, values[:, :-1])
