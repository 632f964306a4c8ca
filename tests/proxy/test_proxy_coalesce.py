"""WriteCoalescer: parts queued behind a member's call leave together, each with its own result.

The sender here is a plain async function that records its calls and answers from a script: the
coalescer's logic is tested alone; test_proxy_write_parts.py runs it between real gRPC stores.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.cluster.assign import assign
from metricsd.cluster.shardmap import Member, ShardMap
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.coalesce import CoalesceSettings, WriteCoalescer
from metricsd.rpc.backend import BadRequest, Unavailable

MAP = assign([Member("a", "127.0.0.1:1")], None, 4, 1)


def part(tag: int, samples: int = 1) -> bytes:
    """A serialized part named by its first id, with ``samples`` samples (8 + 10 * samples bytes or so)."""
    return pb.WriteRequest(ids=[tag], counts=[samples], timestamps=list(range(samples)),
                           values=[0.0] * samples).SerializeToString()


def tag_of(p: bytes) -> int:
    return int(pb.WriteRequest.FromString(p).ids[0])


class Sender:
    """Records each call's parts; a call waits for ``gate`` when one is set; a part whose tag is in
    ``refuse`` gets BadRequest; ``fail_calls`` fails the whole call."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate: asyncio.Event | None = None
        self.refuse: set[int] = set()
        self.fail_calls = False

    async def __call__(self, member: str, shard_map: ShardMap, parts: list[bytes]
                       ) -> Sequence[pb.WriteResponse | Exception]:
        self.calls.append([tag_of(p) for p in parts])
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_calls:
            raise Unavailable(f"{member} down")
        return [BadRequest(f"part {tag_of(p)} refused") if tag_of(p) in self.refuse
                else pb.WriteResponse(samples_written=tag_of(p)) for p in parts]


async def until(cond: object, rounds: int = 100) -> None:
    for _ in range(rounds):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_a_part_on_a_quiet_member_goes_out_at_once_alone() -> None:
    send = Sender()
    c = WriteCoalescer(send, CoalesceSettings(linger_s=0), Counter())
    resp = await c.write("a", MAP, part(7))
    assert resp.samples_written == 7
    assert send.calls == [[7]]
    await c.close()


async def test_a_part_on_a_quiet_member_waits_the_linger_for_others_but_not_behind_a_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The linger's timer is taken from the loop's call_later and fired by hand: no time passes."""
    send = Sender()
    c = WriteCoalescer(send, CoalesceSettings(linger_s=0.5), Counter())
    timers: list[tuple[float, Callable[..., object], tuple[object, ...]]] = []
    monkeypatch.setattr(asyncio.get_running_loop(), "call_later",
                        lambda delay, callback, *args: timers.append((delay, callback, args)))
    first = asyncio.create_task(c.write("a", MAP, part(1)))
    await until(lambda: len(timers) == 1)
    assert timers[0][0] == 0.5  # it waits the linger
    await until(lambda: c.queued("a") == 1)
    assert send.calls == []  # later loop iterations, within the linger: nothing left yet
    send.gate = asyncio.Event()
    second = asyncio.create_task(c.write("a", MAP, part(2)))
    await until(lambda: c.queued("a") == 2)
    assert len(timers) == 1  # joins the first part's linger
    _, callback, args = timers.pop()
    callback(*args)  # the linger ends
    await until(lambda: bool(send.calls))
    assert send.calls == [[1, 2]]
    third = asyncio.create_task(c.write("a", MAP, part(3)))  # queued behind the call under way
    await until(lambda: c.queued("a") == 1)
    send.gate.set()
    await asyncio.gather(first, second, third)
    assert send.calls == [[1, 2], [3]] and timers == []  # left as the call ended, no linger
    await c.close()


def test_the_linger_is_bounded() -> None:
    with pytest.raises(ValueError, match="linger_s"):
        CoalesceSettings(linger_s=2)


async def test_parts_queued_behind_a_call_leave_together_each_with_its_own_result() -> None:
    send = Sender()
    counters: Counter[str] = Counter()
    c = WriteCoalescer(send, CoalesceSettings(linger_s=0), counters)
    send.gate = asyncio.Event()
    first = asyncio.create_task(c.write("a", MAP, part(1)))
    await until(lambda: send.calls == [[1]])
    send.refuse = {4}
    rest = [asyncio.create_task(c.write("a", MAP, part(t))) for t in (2, 3, 4, 5)]
    await until(lambda: c.queued("a") == 4)
    assert send.calls == [[1]]  # nothing else leaves while the first call is under way
    send.gate.set()
    got = await asyncio.gather(first, *rest, return_exceptions=True)
    assert send.calls == [[1], [2, 3, 4, 5]]
    assert [g.samples_written for g in got if isinstance(g, pb.WriteResponse)] == [1, 2, 3, 5]
    assert isinstance(got[3], BadRequest) and "part 4" in str(got[3])  # only its own part fails
    assert counters["member_write_calls"] == 2 and counters["member_write_parts"] == 5
    await c.close()


async def test_a_failed_call_fails_every_part_in_it_and_the_next_call_still_goes() -> None:
    send = Sender()
    c = WriteCoalescer(send, CoalesceSettings(linger_s=0), Counter())
    send.gate = asyncio.Event()
    send.fail_calls = True
    tasks = [asyncio.create_task(c.write("a", MAP, part(t))) for t in (1, 2, 3)]
    await until(lambda: len(send.calls) == 1)
    assert send.calls == [[1, 2, 3]]  # written in one loop iteration: one call, even on a quiet member
    send.gate.set()
    got = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(g, Unavailable) for g in got)
    send.fail_calls = False
    assert (await c.write("a", MAP, part(9))).samples_written == 9
    await c.close()


async def test_members_are_independent_and_maps_are_not_mixed_in_one_call() -> None:
    send = Sender()
    c = WriteCoalescer(send, CoalesceSettings(linger_s=0), Counter())
    other_map = assign([Member("a", "127.0.0.1:1")], None, 4, 1)
    send.gate = asyncio.Event()
    tasks = [asyncio.create_task(c.write("a", MAP, part(1)))]
    await until(lambda: len(send.calls) == 1)
    tasks.append(asyncio.create_task(c.write("b", MAP, part(100))))  # another member: not queued behind "a"
    await until(lambda: len(send.calls) == 2)
    plan = ((MAP, 2), (MAP, 3), (other_map, 4), (other_map, 5))
    tasks += [asyncio.create_task(c.write("a", m, part(t))) for m, t in plan]
    await until(lambda: c.queued("a") == 4)
    send.gate.set()
    await asyncio.gather(*tasks)
    assert send.calls == [[1], [100], [2, 3], [4, 5]]  # a map change ends a call's parts
    await c.close()


async def test_limits_split_the_queue_and_an_oversized_part_goes_alone() -> None:
    send = Sender()
    sizes = {1: 1, 2: 1, 3: 1, 4: 9, 5: 50, 6: 1}
    limit = len(part(3, 1)) + len(part(4, 9))  # parts 3 and 4 fit together, 4 and 5 do not
    c = WriteCoalescer(send, CoalesceSettings(max_parts=2, max_bytes=limit, linger_s=0), Counter())
    send.gate = asyncio.Event()
    tasks = [asyncio.create_task(c.write("a", MAP, part(0)))]
    await until(lambda: len(send.calls) == 1)
    tasks += [asyncio.create_task(c.write("a", MAP, part(t, n))) for t, n in sizes.items()]
    await until(lambda: c.queued("a") == 6)
    send.gate.set()
    await asyncio.gather(*tasks)
    assert send.calls == [[0], [1, 2], [3, 4], [5], [6]]
    await c.close()


async def test_a_writer_that_gives_up_while_queued_is_not_sent() -> None:
    send = Sender()
    c = WriteCoalescer(send, CoalesceSettings(linger_s=0), Counter())
    send.gate = asyncio.Event()
    first = asyncio.create_task(c.write("a", MAP, part(1)))
    await until(lambda: len(send.calls) == 1)
    gone = asyncio.create_task(c.write("a", MAP, part(2)))
    kept = asyncio.create_task(c.write("a", MAP, part(3)))
    await until(lambda: c.queued("a") == 2)
    gone.cancel()
    send.gate.set()
    await asyncio.gather(first, kept)
    assert gone.cancelled()
    assert send.calls == [[1], [3]]
    await c.close()


async def test_a_full_queue_refuses_new_parts_with_unavailable() -> None:
    send = Sender()
    counters: Counter[str] = Counter()
    c = WriteCoalescer(send, CoalesceSettings(max_queued=2, linger_s=0), counters)
    send.gate = asyncio.Event()
    tasks = [asyncio.create_task(c.write("a", MAP, part(1)))]
    await until(lambda: len(send.calls) == 1)
    tasks += [asyncio.create_task(c.write("a", MAP, part(t))) for t in (2, 3)]
    await until(lambda: c.queued("a") == 2)
    with pytest.raises(Unavailable, match="2 write parts already queued"):
        await c.write("a", MAP, part(4))
    assert counters["write_parts_queue_full"] == 1
    send.gate.set()
    await asyncio.gather(*tasks)
    await c.close()


async def test_no_coalescing_sends_a_call_per_part_concurrently() -> None:
    send = Sender()
    c = WriteCoalescer(send, CoalesceSettings(calls_per_member=0, linger_s=0), Counter())
    send.gate = asyncio.Event()
    tasks = [asyncio.create_task(c.write("a", MAP, part(t))) for t in (1, 2, 3)]
    await until(lambda: len(send.calls) == 3)
    assert c.queued("a") == 0
    send.gate.set()
    await asyncio.gather(*tasks)
    assert sorted(send.calls) == [[1], [2], [3]]
    await c.close()


async def test_close_cancels_queued_writers_and_calls_under_way() -> None:
    send = Sender()
    c = WriteCoalescer(send, CoalesceSettings(linger_s=0), Counter())
    send.gate = asyncio.Event()  # never set
    tasks = [asyncio.create_task(c.write("a", MAP, part(1)))]
    await until(lambda: len(send.calls) == 1)
    tasks.append(asyncio.create_task(c.write("a", MAP, part(2))))
    await until(lambda: c.queued("a") == 1)
    await c.close()
    got = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(g, asyncio.CancelledError) for g in got)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 30), st.booleans()), min_size=1, max_size=40),
       st.integers(0, 3), st.integers(1, 5))
def test_every_part_gets_exactly_its_own_outcome_in_order_per_member(
        writes: list[tuple[str, int, bool]], calls_per_member: int, max_parts: int) -> None:
    """Whatever the timing: each writer gets its own part's outcome, no part is sent twice or lost,
    a member's parts leave in the order they came, and no call exceeds the limits."""
    async def run() -> None:
        send = Sender()
        send.refuse = {i for i, (_, _, bad) in enumerate(writes) if bad}
        c = WriteCoalescer(send, CoalesceSettings(calls_per_member=calls_per_member, max_parts=max_parts, linger_s=0,
                                                  max_bytes=200), Counter())
        tasks = []
        for i, (member, samples, _) in enumerate(writes):
            tasks.append(asyncio.create_task(c.write(member, MAP, part(i, samples))))
            if i % 3 == 0:
                await asyncio.sleep(0)
        got = await asyncio.gather(*tasks, return_exceptions=True)
        for i, g in enumerate(got):
            if i in send.refuse:
                assert isinstance(g, BadRequest) and f"part {i} " in f"{g} "
            else:
                assert isinstance(g, pb.WriteResponse) and g.samples_written == i
        sent = [t for call in send.calls for t in call]
        assert sorted(sent) == list(range(len(writes)))
        for member in "ab":
            order = [t for t in sent if writes[t][0] == member]
            assert order == sorted(order)
        for call in send.calls:
            assert len(call) <= (max_parts if calls_per_member else 1)
            assert len(call) == 1 or sum(len(part(t, writes[t][1])) for t in call) <= 200
        await c.close()

    asyncio.run(run())
