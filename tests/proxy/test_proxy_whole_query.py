"""A whole PromQL query sent to one store (metricsd/proxy/wholequery.py), in one process: three
real stores, each with its slot-ownership check, gRPC server and read port answering QUERY frames
(metricsd/http/wholequery.py); a real ProxyBackend dialling them and its real HTTP API on
loopback (whole_query_harness.py). The maps the proxy and the stores hold are set apart to make a
stale map."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_cluster import SLOTS, fast_settings
from whole_query_harness import AT, QUERIES, T0, Harness, learn_slow, rates_together

from metricsd.cluster.shardmap import ShardMap
from metricsd.http.wholehttp import may_select
from metricsd.promql.limits import QueryLimits
from metricsd.proxy.latency import HedgeSettings, LatencyTracker
from metricsd.proxy.members import MemberClient
from metricsd.proxy.settings import HealthSettings
from metricsd.proxy.wholequery import GRACE_S, first_place, hedge_delay, whole_order
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.wholequery import LIMIT_NAMES, QueryFrame, RunnerSettings, decode_request, encode_request


async def _both(h: Harness, path: str, **params: str) -> tuple[tuple[int, Any], tuple[int, Any]]:
    """(the default answer: consistency one, the whole path; the quorum path's answer)."""
    return await h.get(path, **params), await h.get(path, consistency="quorum", **params)


@pytest.mark.parametrize("query", QUERIES)
async def test_a_query_sent_whole_answers_what_the_proxys_own_quorum_path_answers(harness: Harness,
                                                                                   query: str) -> None:
    whole0 = harness.counter("whole_queries")
    (s1, one), (s2, quorum) = await _both(harness, "/api/v1/query", query=query, time=AT)
    sent = 1 if may_select(query) else 0  # `1` reads nothing: the proxy answers it without a hop
    assert s1 == s2 == 200, (one, quorum)
    assert same_answer(one, quorum) and one["data"]["result"], (one, quorum)
    assert harness.counter("whole_queries") == whole0 + sent  # the default took the whole path, quorum did not
    (s1, one), (s2, quorum) = await _both(harness, "/api/v1/query_range", query=query, start=str(T0 / 1000 + 300),
                                          end=AT, step="30")
    assert s1 == s2 == 200 and same_answer(one, quorum) and one["data"]["result"], (one, quorum)
    assert harness.counter("whole_queries") == whole0 + 2 * sent
    answered = sum(n.service.answered for n in harness.nodes.values() if n.service is not None)
    assert whole0 + 2 * sent <= answered <= whole0 + 2 * sent + harness.counter("whole_query_hedges")  # a hedge's too


@pytest.mark.parametrize("harness", [{"max_samples": 1500}], indirect=True)
async def test_query_errors_come_back_with_the_same_status_and_message(harness: Harness) -> None:
    """Each error as the proxy's own path of consistency one (the whole path off) answers it, and
    but for the sample limit as the quorum path does (there it is a 422 too, but the limit is
    passed only by the merged replies, so the proxy's own message names it)."""
    cases = [
        ("/api/v1/query", {"query": "sum(", "time": AT}, 400),  # a parse error
        ("/api/v1/query", {"query": 'label_replace(up, "a", "$1", "b", "(")', "time": AT}, 422),  # unsupported
        ("/api/v1/query", {"query": 'count_over_time({__name__=~".+"}[10m])', "time": AT},
         422),  # 48 series x 40 samples, over --query.max-samples 1500
        ("/api/v1/query_range", {"query": "1", "start": AT, "end": str(T0 / 1000), "step": "10"}, 400),
        ("/api/v1/query_range", {"query": "1", "start": str(T0 / 1000), "end": AT, "step": "0"}, 400),
        ("/api/v1/query", {"query": "1" + "+1" * 300, "time": AT}, 400),  # over the limits' 256 operators
        ("/api/v1/query", {"query": "1", "time": AT, "timeout": "-1s"}, 400),
    ]
    answered: list[tuple[int, Any]] = []
    whole0 = harness.counter("whole_queries")
    for path, params, status in cases:
        answered.append(await harness.get(path, **params))
        assert answered[-1][0] == status, (params, answered[-1])
    sent_whole = harness.counter("whole_queries") - whole0
    harness.proxy.whole_queries.enabled = False
    for (path, params, status), (got_status, got) in zip(cases, answered, strict=True):
        assert await harness.get(path, **params) == (got_status, got), params
        if status != 422:
            assert await harness.get(path, consistency="quorum", **params) == (got_status, got), params
    assert harness.counter("whole_queries") - whole0 == sent_whole
    # answered by a store: the parse error and the two limits; the queries of `1` by the proxy
    assert sent_whole == 3


async def test_a_store_whose_map_differs_refuses_and_the_proxy_answers_by_its_own_path(harness: Harness) -> None:
    """The stores' map has moved on (store-0, the proxy's first choice, now holds half the slots
    at RF 2); the proxy still routes on the old one (every store holds every slot). store-0
    refuses each whole query, the proxy falls back, evaluates it itself, and refreshes its map."""
    want = await harness.get("/api/v1/query", query=QUERIES[1], time=AT, consistency="quorum")
    # no hedge under load: past the 50 ms initial delay another store was asked too, and the
    # counts of who answered below came out 0 or 2 instead of 1
    learn_slow(harness, harness.proxy.whole_queries.latency.settings.max_s)
    nodes = list(harness.nodes.values())
    old = harness.proxy_maps.current()
    assert old is not None
    assignments = [(("store-1", "store-0") if s % 2 == 0 else ("store-1", "store-2")) for s in range(SLOTS)]
    new = ShardMap(old.version + 1, 2, tuple(assignments), old.members)
    for n in nodes:
        assert n.maps is not None
        n.maps.set(new)
    for _ in range(6):
        status, body = await harness.get("/api/v1/query", query=QUERIES[1], time=AT)
        assert status == want[0] == 200 and same_answer(body, want[1]), (body, want)
    assert harness.counter("whole_query_stale_map") == 6
    assert harness.counter("map_refreshes") >= 1
    assert nodes[1].service is not None and nodes[1].service.answered == 0
    harness.proxy.whole_queries.first = 1  # a proxy that starts from store-1, which holds everything
    status, body = await harness.get("/api/v1/query", query=QUERIES[1], time=AT)
    assert status == 200 and same_answer(body, want[1]), (body, want)
    assert nodes[1].service.answered == 1 and harness.counter("whole_query_stale_map") == 6


@pytest.mark.parametrize("harness", [{"old": ("store-0",)}], indirect=True)
async def test_a_store_that_does_not_know_the_frame_is_read_the_old_way(harness: Harness) -> None:
    want = await harness.get("/api/v1/query", query=QUERIES[0], time=AT, consistency="quorum")
    for _ in range(6):
        status, body = await harness.get("/api/v1/query", query=QUERIES[0], time=AT)
        assert status == want[0] == 200 and same_answer(body, want[1]), (body, want)
    assert harness.counter("whole_query_unsupported") == 1  # then left alone for UNSUPPORTED_RETRY_S
    assert harness.counter("whole_queries") == 5


async def test_a_frame_out_of_format_is_refused_and_changes_nothing(harness: Harness) -> None:
    node = harness.nodes["store-0"]
    assert node.service is not None
    for body in (b"", b"[]", b"{", b"[" * 100_000 + b"]" * 100_000, b'{"query": 1}'):
        with pytest.raises(BadRequest, match="query frame"):
            await node.service.answer(body)




def test_a_frames_settings_decode_in_any_order_and_a_wrong_type_is_refused() -> None:
    limits = QueryLimits()
    settings = RunnerSettings(300_000, 1000, True, 10.0, tuple((k, int(getattr(limits, k))) for k in LIMIT_NAMES))
    frame = QueryFrame(QUERIES[3], False, 1, 60_000, 15_000, 5.0, SLOTS, None, settings)
    doc = orjson.loads(encode_request(frame))
    assert decode_request(encode_request(frame)) == frame
    doc["settings"] = dict(reversed(doc["settings"].items()))  # another proxy's order: the same settings
    doc["settings"]["limits"] = dict(reversed(doc["settings"]["limits"].items()))
    assert decode_request(orjson.dumps(doc)) == frame
    for where, value in (("settings", [1]), ("limits", [1]), ("settings", {"x": 1}), ("limits", "8")):
        bad = orjson.loads(encode_request(frame))
        target = bad["settings"] if where == "settings" else bad["settings"]["limits"]
        target["max_samples" if where == "settings" else LIMIT_NAMES[0]] = value
        with pytest.raises(ValueError, match="query frame"):
            decode_request(orjson.dumps(bad))

# store-0's down mark lasts the test: fast_settings' 50-200 ms ran out under a loaded machine
@pytest.mark.parametrize("harness", [{"settings": {"health": HealthSettings(down_initial_s=60, down_max_s=60)}}],
                         indirect=True)
async def test_one_proxy_asks_the_same_store_each_time_while_it_has_room(harness: Harness) -> None:
    """Queries one after another all go to the proxy's first store (a store asked in turn with two
    others spent ~1.8x the CPU a frame, perf/RESULTS.md); with it down, all to the next one."""
    nodes = list(harness.nodes.values())
    learn_slow(harness, harness.proxy.whole_queries.latency.settings.max_s)
    before = [n.service.answered for n in nodes if n.service is not None]
    for i in range(5):
        status, body = await harness.get("/api/v1/query", query=QUERIES[i % 4], time=AT)
        assert status == 200 and body["data"]["result"], body
    after = [n.service.answered for n in nodes if n.service is not None]
    assert [a - b for a, b in zip(after, before, strict=True)] == [5, 0, 0]
    harness.proxy.view.health.failure("store-0", "test: marked down")
    for i in range(4):
        status, body = await harness.get("/api/v1/query", query=QUERIES[i], time=AT)
        assert status == 200 and body["data"]["result"], body
    last = [n.service.answered for n in nodes if n.service is not None]
    assert [a - b for a, b in zip(last, after, strict=True)] == [0, 4, 0]


async def test_a_query_no_store_answers_ends_at_its_deadline_with_the_stores_counted_failed(harness: Harness) -> None:
    """Every store stalls: the query ends at its timeout and GRACE_S, hedges included (one deadline
    for the whole path), with the API's timeout answer, and each store asked is counted failed."""
    released = asyncio.Event()
    for node in harness.nodes.values():
        assert node.service is not None

        async def stall(body: bytes, answer: Any = node.service.answer) -> bytes:
            await released.wait()
            return bytes(await answer(body))

        node.servers[0].query = stall
    t0 = time.monotonic()
    try:
        status, body = await harness.get("/api/v1/query", query=QUERIES[0], time=AT, timeout="200ms")
    finally:
        released.set()
    took = time.monotonic() - t0
    assert (status, body["errorType"]) == (503, "timeout"), body
    assert 0.2 + GRACE_S <= took < 0.2 + GRACE_S + 3.0, took  # a loaded machine's seconds at most
    asked = 1 + harness.counter("whole_query_hedges")
    assert asked >= 2  # the initial delay (50 ms) passed: the next store was asked too
    assert sum(harness.proxy.view.health.failed(m) for m in harness.nodes) == asked


@pytest.mark.parametrize(("harness", "together", "spread"),
                         [({"settings": {"whole_spill": 1}}, 3, [1, 1, 1]),
                          ({"settings": {"whole_spill": 3}}, 5, [3, 1, 1]),
                          ({"settings": {"whole_spill": 8}}, 8, [8, 0, 0])], indirect=["harness"])
async def test_concurrent_queries_started_in_one_turn_spread_past_the_spill(harness: Harness, together: int,
                                                                            spread: list[int]) -> None:
    """Queries started together (a dashboard's panels): the first store takes ``whole_spill`` of
    them (``metricsd proxy --spill-in-flight``), the rest go to the others in turn, as each query
    counts against its store from the moment it is picked."""
    nodes = list(harness.nodes.values())
    learn_slow(harness, harness.proxy.whole_queries.latency.settings.max_s)  # no hedge under load
    before = [n.service.answered for n in nodes if n.service is not None]
    answers = await rates_together(harness, together)
    assert all(a is not None and a.data for a in answers), answers
    after = [n.service.answered for n in nodes if n.service is not None]
    assert [a - b for a, b in zip(after, before, strict=True)] == spread
    assert sum(harness.proxy.whole_queries.in_flight.values()) == 0


async def test_an_answer_is_taken_as_it_lands_not_at_the_hedge_delay(harness: Harness) -> None:
    """A store's answer wakes the query at once: with a 20 s hedging delay learnt (and 10 s of
    timeout), a query waiting for a timer instead of the answer would take 11 s."""
    harness.proxy.whole_queries.latency = LatencyTracker(HedgeSettings(max_s=30.0))
    learn_slow(harness, 20.0)
    assert all(a is not None and a.data for a in await rates_together(harness, 1))  # its connection warm
    t0 = time.monotonic()
    assert all(a is not None and a.data for a in await rates_together(harness, 3))
    assert time.monotonic() - t0 < 5.0
    assert harness.counter("whole_query_hedges") == 0


def test_the_spill_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="whole_spill"):
        fast_settings(whole_spill=0)


@pytest.mark.parametrize("harness", [{"settings": {"whole_spill": 1}}], indirect=True)  # spread: two each
async def test_concurrent_queries_while_a_stores_read_port_is_learnt_all_go_whole(harness: Harness) -> None:
    """Six queries at once to a proxy that has read nothing yet: each store's read port is still
    being asked for (its Health) when its second query arrives. That query waits for the answer
    and goes whole too; it was refused as if the store had no read port, and the store left alone
    for UNSUPPORTED_RETRY_S (a minute in which concurrency 8 went to one store of three)."""
    nodes = list(harness.nodes.values())
    answers = await rates_together(harness, 6)
    assert all(a is not None and a.data for a in answers), answers
    assert harness.counter("whole_query_unsupported") == harness.counter("whole_query_no_port") == 0
    assert harness.counter("whole_queries") == 6
    answered = [n.service.answered for n in nodes if n.service is not None]
    # two each; a hedge (the initial delay, on a loaded machine) asks a store once more
    assert min(answered) >= 2 and sum(answered) == 6 + harness.counter("whole_query_hedges"), answered


async def test_a_read_cancelled_while_the_read_port_is_asked_for_does_not_lose_the_port(harness: Harness) -> None:
    """The first whole query to a store asks its Health for the read port; when that query is
    cancelled meanwhile (a hedge won elsewhere, the client went away), the probe still ends and
    the next query has the port: it had none for REPROBE_S, every query sent elsewhere."""
    shard_map = harness.proxy_maps.current()
    assert shard_map is not None
    member = harness.proxy.view.pool.get(shard_map, "store-1")
    assert isinstance(member, MemberClient)
    first = asyncio.ensure_future(member._read_port())
    await asyncio.sleep(0)  # the probe is under way
    first.cancel()
    assert await member._read_port() is not None
    status, body = await harness.get("/api/v1/query", query=QUERIES[0], time=AT)
    assert status == 200 and body["data"]["result"] and harness.counter("whole_query_no_port") == 0


async def test_a_store_without_a_read_port_is_passed_over_for_the_next(harness: Harness) -> None:
    """A store the proxy has no read port to (here: given up on after a failure) is skipped for
    the next store at once, query by query, not counted as down nor left alone for a minute."""
    shard_map = harness.proxy_maps.current()
    assert shard_map is not None
    member = harness.proxy.view.pool.get(shard_map, "store-0")
    assert isinstance(member, MemberClient)
    member._probed_at, member._port_client = time.monotonic(), None  # as after a failed read port
    # no hedge under load: past the 50 ms initial delay store-2 answered for a slow store-1 and
    # store-1's answers were still under way at the counts below
    learn_slow(harness, harness.proxy.whole_queries.latency.settings.max_s)
    nodes = list(harness.nodes.values())
    for i in range(3):
        status, body = await harness.get("/api/v1/query", query=QUERIES[i], time=AT)
        assert status == 200 and body["data"]["result"], body
    assert harness.counter("whole_query_no_port") == 3 and harness.counter("whole_query_unsupported") == 0
    answered = [n.service.answered for n in nodes if n.service is not None]
    # store-1 took them (store-2 only a hedge's: the first delay is short, the machine may be loaded)
    assert answered[0] == 0 and answered[1] == 3 and answered[2] == harness.counter("whole_query_hedges"), answered
    assert harness.counter("whole_queries") == 3 and harness.proxy.view.health.is_healthy("store-0")
    member._probed_at = None  # its read port asked for again: the first store takes the next query
    status, body = await harness.get("/api/v1/query", query=QUERIES[0], time=AT)
    assert status == 200 and nodes[0].service is not None and nodes[0].service.answered == 1


@pytest.mark.parametrize("harness", [{"settings": {"whole_spill": 10}}], indirect=True)  # all on store-0
async def test_queries_queued_on_a_busy_store_are_not_hedged_for_waiting_their_turn(harness: Harness) -> None:
    """Four queries at once kept on store-0, which answers one at a time in 0.25 s each (a store
    bound by its CPU), with a learnt delay of 0.6 s: the third and fourth wait 0.75 and 1 s for
    their turn, past one query's delay, and were each asked of a second store too. Waiting for
    the queries ahead of them is not slowness: no hedge. A stalled store is still passed by.

    The margins are for a loaded machine: each query may spend 0.35 s beyond its 0.25 s turn before
    its (scaled) delay runs out; the tracker's ceiling is raised to 2 s so that the bound of
    ``hedge_delay`` does not cut the fourth query's 2.4 s (that bound has its own test below)."""
    harness.proxy.whole_queries.latency = LatencyTracker(HedgeSettings(max_s=2.0))
    node = harness.nodes["store-0"]
    assert node.service is not None
    turn = asyncio.Lock()
    answer = node.service.answer

    async def one_at_a_time(body: bytes) -> bytes:
        async with turn:
            await asyncio.sleep(0.25)
            return await answer(body)

    learn_slow(harness, 2.0)  # the first query below, and the stalled case's second store, never hedged
    assert all(a is not None and a.data for a in await rates_together(harness, 1))  # its connection and caches warm
    node.servers[0].query = one_at_a_time
    learn_slow(harness, 0.6, ["store-0"])
    hedges = harness.counter("whole_query_hedges")
    answered = [n.service.answered for n in harness.nodes.values() if n.service is not None]
    assert all(a is not None and a.data for a in await rates_together(harness, 4))
    assert harness.counter("whole_query_hedges") == hedges
    assert [n.service.answered for n in harness.nodes.values() if n.service is not None] == [answered[0] + 4,
                                                                                         *answered[1:]]
    learn_slow(harness, 0.3, ["store-0"])  # the stalled case, quicker (the four answers above are forgotten)
    turn_held = await turn.acquire()  # store-0 stalls: every query passes it within its delay, once each
    assert turn_held
    try:
        assert all(a is not None and a.data for a in await rates_together(harness, 3))
    finally:
        turn.release()
    assert harness.counter("whole_query_hedges") == hedges + 3


def test_a_hedge_waits_one_delay_for_each_query_ahead_within_a_bound() -> None:
    tracker = LatencyTracker(HedgeSettings(min_s=0.001, max_s=0.5))
    assert hedge_delay(tracker, "s", 0) == tracker.delay("s") == 0.05  # the initial delay, unchanged when alone
    for _ in range(64):
        tracker.record("s", 0.004)
    assert hedge_delay(tracker, "s", 0) == 0.004
    assert [round(hedge_delay(tracker, "s", k), 6) for k in (1, 2, 7)] == [0.008, 0.012, 0.032]
    for _ in range(128):
        tracker.record("s", 0.3)
    assert hedge_delay(tracker, "s", 7) == 0.3 + 0.5  # bounded: a stalled store is passed by in time


def test_each_proxy_starts_from_a_store_of_its_own_unless_configured() -> None:
    # several proxies asking one query at a time: at random places they spread over the stores,
    # where one fixed place would put every proxy's queries on the same store
    assert first_place(2) == 2 and first_place(0) == 0
    full = ["store-1", "store-2", "store-3"]
    firsts = {whole_order(full, set(full), {}, first_place(None))[0] for _ in range(60)}
    assert firsts == set(full)
    with pytest.raises(ValueError, match="whole_first"):
        fast_settings(whole_first=-1)


def test_whole_order_keeps_the_first_store_while_it_is_free_then_the_least_busy_in_turn() -> None:
    def order(*args: Any, **kw: Any) -> list[str]:  # the spill at 1: spread at once
        return whole_order(*args, **kw, spill=1)

    full = ["s0", "s1", "s2"]
    every = set(full)
    assert order(full, every, {}, 0) == ["s0", "s1", "s2"]
    assert order(full, every, {}, 4, turn=7) == ["s1", "s2", "s0"]  # a proxy's place: first % 3
    assert order(full, {"s0", "s2"}, {}, 1) == ["s2", "s0"]  # s1 down: the next in order, not a jump
    assert order(full, every, {"s0": 0, "s1": 3}, 0, turn=1) == ["s0", "s1", "s2"]
    busy = {"s0": 1}
    assert order(full, every, busy, 0, turn=0) == ["s1", "s0", "s2"]  # the others free: taken in turn
    assert order(full, every, busy, 0, turn=2) == ["s2", "s0", "s1"]
    assert order(full, every, {"s0": 9, "s1": 9}, 0, turn=0) == ["s2", "s0", "s1"]
    assert order(full, every, {"s0": 9, "s1": 7, "s2": 8}, 0, turn=2) == ["s1", "s0", "s2"]  # least busy
    for turn, want in ((0, "s0"), (1, "s1"), (2, "s2"), (3, "s0")):  # all equally busy: each in turn
        assert order(full, every, {"s0": 5, "s1": 5, "s2": 5}, 0, turn=turn)[0] == want
    assert order(full, every, {"s0": 1, "s1": 2, "s2": 2}, 0, turn=1) == ["s0", "s1", "s2"]  # first least
    assert order(full, {"s1"}, {"s1": 99}, 0) == ["s1"]
    assert order(full, set(), {}, 0) == [] and order([], every, {}, 0) == []


@given(st.integers(1, 6), st.sets(st.integers(0, 5)), st.dictionaries(st.integers(0, 5), st.integers(0, 9)),
       st.integers(0, 100), st.integers(0, 100), st.integers(1, 5))
def test_whole_order_asks_each_qualifying_store_once(n: int, up: set[int], busy: dict[int, int], first: int,
                                                      turn: int, spill: int) -> None:
    full = [f"s{i}" for i in range(n)]
    ok = {f"s{i}" for i in up}
    in_flight = {f"s{i}": v for i, v in busy.items()}
    out = whole_order(full, ok, in_flight, first, turn, spill)
    start = [m for m in full[first % n:] + full[:first % n] if m in ok]  # the proxy's own order
    assert sorted(out) == sorted(start)
    if out:
        load = [in_flight.get(m, 0) for m in out]
        if in_flight.get(start[0], 0) < spill:
            assert out == start
        else:  # the least busy goes first, then the rest in the proxy's order
            assert load[0] == min(load)
            assert out[1:] == [m for m in start if m != out[0]]


def same_answer(a: Any, b: Any) -> bool:
    """Two Prometheus JSON answers alike: the same series (labels, order), timestamps and values,
    a value equal up to the last bits of a float (1e-12 relative): a sum over one store's series
    and the proxy's merge of per-store partials add in different orders (28.999999999999996 and
    28.999999999999993 for 29)."""
    if a.get("status") != "success" or b.get("status") != "success":
        return bool(a == b)
    da, db = a["data"], b["data"]
    if da["resultType"] != db["resultType"]:
        return False
    if da["resultType"] in ("scalar", "string"):
        return _points_alike([da["result"]], [db["result"]])
    ra, rb = da["result"], db["result"]
    return len(ra) == len(rb) and all(
        x["metric"] == y["metric"]
        and _points_alike(x.get("values", [x.get("value")]), y.get("values", [y.get("value")]))
        for x, y in zip(ra, rb, strict=True))


def _points_alike(xs: list[Any], ys: list[Any]) -> bool:
    return len(xs) == len(ys) and all(
        p[0] == q[0] and (p[1] == q[1] or math.isclose(float(p[1]), float(q[1]), rel_tol=1e-12, abs_tol=0.0))
        for p, q in zip(xs, ys, strict=True))


def test_only_a_query_text_with_a_letter_or_a_brace_may_select_series() -> None:
    for text in ("up", 'sum(rate(x[5m]))', '{__name__="a"}', "vector(1)", "1e3", "NaN", "1 > bool 0"):
        assert may_select(text), text  # some of these read nothing: the proxy may send them all the same
    for text in ("1", " 1 + 2 * (3 - 4) ", "-0.5", "(1) % 7 ^ 2"):
        assert not may_select(text), text
