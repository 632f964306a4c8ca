"""StoreAPI.read_selection (the PromQL prefetch's read of a store in its process, matchers without
a ReadRequest) answers as read_columns does, with the same limits; the label columns it keeps for
a one-row selection follow the series as series are added and removed;
and the narrow path's plan (selector_fetch) is plan_fetches' for a query of one selector."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.promql.engine import parse
from metricsd.promql.prefetch import plan_fetches, selector_fetch
from metricsd.promql.selectors import EvalContext
from metricsd.promql.source import MemorySource
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import LimitExceeded
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import parse_selector
from metricsd.store.api import StoreAPI
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

T0 = 1_700_000_000_000


def _write(api: StoreAPI, pods: list[str], t0: int, n: int = 30) -> None:
    labels = [make_labels("cpu", {"namespace": "ns", "pod": p, "node": f"n{len(p) % 3}"}) for p in pods]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    ts = np.concatenate([t0 + np.arange(n) * 10_000 for _ in pods])
    api.store.write(ids, np.full(len(ids), n), ts, np.arange(len(ts), dtype=np.float64),
                    {int(i): lab for i, lab in zip(ids.tolist(), labels, strict=True)})


def _same(a: object, b: object) -> None:
    assert a.labels.to_list() == b.labels.to_list()  # type: ignore[attr-defined]
    for name in ("offsets", "timestamps", "ids"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist()
    assert a.values.view(np.int64).tolist() == b.values.view(np.int64).tolist()  # type: ignore[attr-defined]


@pytest.mark.parametrize("selector", ['pod="p1"', 'pod=~"p1.*"', 'pod="nobody"', "", 'node!="n1",pod=~"p[0-4]"'])
def test_read_selection_answers_as_read_columns(selector: str) -> None:
    api = StoreAPI(Store(StoreSettings(chunk_samples=8, head_keep=4)))
    _write(api, [f"p{i}" for i in range(15)], T0)
    matchers = parse_selector(selector, "cpu")
    for lo, hi in ((0, 2**62), (T0 + 55_000, T0 + 123_000), (T0 - 10, T0 - 1)):
        for _ in range(2):  # the second time from what was kept
            want = api.read_columns(pb.ReadRequest(matchers=matchers_to_pb(matchers), start_ms=lo, end_ms=hi))
            _same(api.read_selection(matchers, lo, hi), want)


def test_read_selection_refuses_as_read_columns() -> None:
    api = StoreAPI(Store())
    _write(api, ["p1", "p2", "p3"], T0)
    matchers = parse_selector('pod=~"p.*"', "cpu")
    req = pb.ReadRequest(matchers=matchers_to_pb(matchers), end_ms=2**62, max_series=2)
    for read in (lambda: api.read_columns(req), lambda: api.read_selection(matchers, 0, 2**62, 2)):
        with pytest.raises(LimitExceeded) as e:
            read()
        assert "3" in str(e.value)
    one = parse_selector('pod="p1"', "cpu")
    with pytest.raises(LimitExceeded) as by_selection:
        api.read_selection(one, 0, 2**62, 0, 29)
    with pytest.raises(LimitExceeded) as by_request:
        api.read_columns(pb.ReadRequest(matchers=matchers_to_pb(one), end_ms=2**62, max_samples=29))
    assert str(by_selection.value) == str(by_request.value)
    assert len(api.read_selection(one, 0, 2**62, 0, 30).timestamps) == 30


def test_the_kept_labels_follow_the_series_as_series_are_added_and_removed() -> None:
    api = StoreAPI(Store(StoreSettings(retention_ms=600_000)))
    t = T0
    for step in range(8):
        pods = [f"s{step}-a", f"s{step}-b"]
        _write(api, pods, t)
        api.store.gc()  # the series of an hour ago fall out of retention: removed, as others are added
        _write(api, pods, t + 300_000)
        for pod in pods:
            got = api.read_selection(parse_selector(f'pod="{pod}"', "cpu"), 0, 2**62)
            assert len(got) == 1
            assert dict(got.labels.labels_at(0))["pod"] == pod
            assert got.labels.to_list() == api.store.index.label_columns(api.store.select(
                parse_selector(f'pod="{pod}"', "cpu"))).to_list()
        t += 3_600_000
    assert api.store.index.n_alive == 2 and len(api.store.index.labels) == 16  # removed as others were added
    assert api._labels_kept


@pytest.mark.parametrize("query", ["rate(cpu[1m])", 'increase(cpu{pod="x"}[5m] offset 10m)', "delta(cpu[90s] @ 1000)",
                                   "max_over_time(cpu[1h] @ end())", 'irate(cpu{pod=~"a|b"}[2m] @ start() offset -1m)'])
def test_the_narrow_plan_is_plan_fetches(query: str) -> None:
    ast, negative_at = parse(query)
    steps = np.arange(T0, T0 + 3_600_001, 30_000, dtype=np.int64)
    ctx = EvalContext(MemorySource(), T0, T0 + 3_600_000, 30_000, steps, 300_000, 1000, negative_at)
    assert [selector_fetch(ast.args[0], ctx)] == plan_fetches(ast, ctx)
    assert selector_fetch(ast, ctx) is None


async def test_a_query_frames_slot_filter_holds_on_the_narrow_path() -> None:
    """A store answering a proxy's QUERY frame reads through SlotScoped (only the frame's slots);
    the prefetch's in-process read_selection must not slip past it by SlotScoped.__getattr__."""
    from metricsd.http import wholequery
    from metricsd.promql.queries import QueryRunner
    from metricsd.store.api import LocalBackend

    api = StoreAPI(Store())
    _write(api, ["p1"], T0)
    scoped = wholequery.SlotScoped(LocalBackend(api))
    runner = QueryRunner(scoped)
    expr, start, end = 'rate(cpu{pod="p1"}[1m])', T0 + 60_000, T0 + 280_000
    assert len((await runner.range(expr, start, end, 10_000))[0].series) == 1  # no filter: every slot
    row = int(api.store.select(parse_selector('pod="p1"', "cpu"))[0])
    slot = int(api.store.index.pod_hash[row] % np.uint64(4))
    token = wholequery._SLOTS.set(pb.SlotFilter(slot_count=4, slots=[s for s in range(4) if s != slot]))
    try:
        assert (await runner.range(expr, start, end, 10_000))[0].series == []
    finally:
        wholequery._SLOTS.reset(token)


async def test_a_frames_read_selection_over_a_backend_without_one_reads_the_same_slots() -> None:
    """SlotScoped.read_selection over a backend that has no read_selection (only read): the same
    answer through the ReadRequest it stands for, scoped to the frame's slots all the same."""
    from metricsd.http import wholequery
    from metricsd.store.api import LocalBackend

    api = StoreAPI(Store())
    _write(api, ["p1", "p2", "p3", "p4"], T0)
    local = LocalBackend(api)

    class ReadOnly:  # a backend of the Read call only, as a remote store's client is
        async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
            return await local.read(request)

    matchers = parse_selector('namespace="ns"', "cpu")
    rows = api.store.select(matchers)
    slot = int(api.store.index.pod_hash[int(rows[0])] % np.uint64(4))
    token = wholequery._SLOTS.set(pb.SlotFilter(slot_count=4, slots=[slot]))
    try:
        got = await wholequery.SlotScoped(ReadOnly()).read_selection(matchers, 0, 2**62)  # type: ignore[arg-type]
        want = await wholequery.SlotScoped(local).read_selection(matchers, 0, 2**62)
    finally:
        wholequery._SLOTS.reset(token)
    assert 0 < len(want) < 4
    _same(got, want)
