"""The :class:`~metricsd.cluster.kv.KV` interface on etcd v3, through the ``aetcd`` client.

aetcd is a thin layer over etcd's gRPC API and leaves two things to its user, both added here:

- A watch ends with an exception when the connection drops. :meth:`EtcdKV.watch` re-subscribes,
  with exponential backoff, from the last revision it delivered + 1, so its caller sees every
  change once and in order across etcd restarts. Each subscription gets its own client (and gRPC
  channel), so that one broken stream cannot take other watches with it.
- A lease is not kept alive. :meth:`EtcdKV.grant` starts a keeper that refreshes it every
  TTL / 3, logs failed refreshes, and declares the lease lost (``Lease.lost``, ``on_lost``) when
  etcd says it expired or when no refresh got through for a whole TTL: by then etcd has dropped
  it, or will as soon as it hears from anyone, so holding on would risk two leaders. Each refresh
  is one unary call on etcd's LeaseKeepAlive method (one request, one answer; etcd ends the call
  at the client's half-close) with a deadline of its own. A long-lived stream per lease cost each
  lease's process two more threads (gRPC's synchronous streaming polls its channel every 200 ms
  and feeds requests from a thread) and a timer thread per refresh, ~0.3 of ~1.5 ms of CPU a
  second an idle store spent (perf/RESULTS.md "Session 42, s42-24i"); a stream per refresh cost
  etcd nothing measurable (perf/RESULTS.md, session 39: 5.5-7.0 against 6.5-7.5 ms a second).

The keeper runs on a thread of its own, with its own synchronous gRPC channel and calls, and
reports a loss to the owner's loop with ``call_soon_threadsafe``. On the owner's loop one long turn
starved it: on the store-restart cluster test a restarted store's loop ran single turns of up to 2.6
s at load 5-9 (asyncio's slow-callback log, py-spy: read-port answers into the empty replica,
``Store._merge_series`` sealing whole series, modules compiled on first use) and, once in six runs
at load 13-17, its 5 s lease expired. What the lease stands for decides whether a thread may keep
it: a member's record says "this process is alive and will serve its slots", and its loss is
answered by moving the slots (whole-slot copies to the others, and back when it registers again),
far too costly an answer to a pause of seconds, which the proxies already ride out request by
request (their timeouts, R of RF replicas, hinted hand-off). It does not say "serves now". A process
wedged for good must still drop out: the owner's loop beats a heartbeat every TTL / 3 and the keeper
stops refreshing once the last beat is older than ``loop_stall_limit_s`` (30 s), so etcd expires the
lease a TTL later. A stopped process (SIGSTOP, a crash) stops its keeper with it: its lease expires
one TTL later, as before. For a leader the thread is also the safer side: a leader whose loop
stalled past its TTL would resume acting before hearing that another took over.

Stopping: cancel tasks that consume a watch with :func:`~metricsd.cluster.kv.cancel_and_wait`.
Python 3.11's ``asyncio.wait_for``, used inside aetcd, can swallow a cancellation that races with
its result, so a single ``cancel()`` may leave the task running.

Events of one revision arrive from etcd in one response and aetcd queues them before the error
that ends the stream, so resuming at "last delivered revision + 1" neither repeats nor skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rpc
import grpc

from metricsd.clock import Clock, SystemClock
from metricsd.cluster.kv import (
    EventType,
    KeyValue,
    KVError,
    KVUnavailable,
    Lease,
    LeaseLostCallback,
    RangeResult,
    Versioned,
    WatchCompacted,
    WatchEvent,
)

__all__ = ["EtcdKV", "EtcdSettings"]

_log = logging.getLogger(__name__)

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.WatchTimeoutError,
    asyncio.TimeoutError,
    grpc.aio.AioRpcError,
    OSError,
)


@dataclass(frozen=True, slots=True)
class EtcdSettings:
    """How to reach etcd and how patient to be with it.

    ``request_timeout_s`` bounds every unary call, so that a paused or partitioned etcd makes
    calls fail with :class:`KVUnavailable` rather than hang. The gRPC keep-alive (10 s) is above
    etcd's default ``--grpc-keepalive-min-time`` of 5 s, which would otherwise cut the stream.
    ``loop_stall_limit_s``: how long a lease's owner loop may go without running a turn before its
    keeper lets the lease expire (a wedged process must drop out; see the module docstring).
    """

    endpoint: str = "127.0.0.1:2379"
    request_timeout_s: float = 5.0
    watch_backoff_initial_s: float = 0.05
    watch_backoff_max_s: float = 2.0
    keepalive_time_ms: int = 10_000
    keepalive_timeout_ms: int = 5_000
    loop_stall_limit_s: float = 30.0

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])


@contextlib.contextmanager
def _translate(what: str) -> Iterator[None]:
    """Turn aetcd's and gRPC's exceptions into ours, naming the operation."""
    try:
        yield
    except KVError:
        raise
    except _UNAVAILABLE as e:
        raise KVUnavailable(f"etcd unavailable during {what}: {_describe(e)}") from e
    except aetcd.exceptions.ClientError as e:
        raise KVError(f"etcd error during {what}: {_describe(e)}") from e


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _EtcdLease(Lease):
    """A lease kept alive by a thread of its own, so that no long turn of the owner's loop can
    starve the keep-alive; see the module docstring.

    The keeper speaks gRPC's synchronous API on a channel of its own, not grpc.aio on a second event
    loop: grpc.aio wakes every loop bound to it on each completion (its poller's one notification
    socket), so a second loop made each of the owner's own gRPC calls cost 20-30% more CPU (an echo
    server and client on one loop, 5,000 calls, with and without an idle second loop; the
    synchronous channel in a thread made no difference).

    The owner's loop beats a heartbeat (a timer every TTL / 3); the keeper refreshes only while
    the last beat is younger than ``settings.loop_stall_limit_s``. Loss is reported on the owner's
    loop (``call_soon_threadsafe``): ``lost`` and ``on_lost`` belong to it.
    """

    def __init__(self, kv: EtcdKV, lease_id: int, ttl: int, on_lost: LeaseLostCallback | None) -> None:
        super().__init__(lease_id, ttl, on_lost)
        self._kv = kv
        self._interval = max(ttl / 3.0, 0.05)
        self._owner: asyncio.AbstractEventLoop | None = None
        self._beat = kv._clock.monotonic()  # when the owner's loop last ran a turn (its heartbeat)
        self._beating: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # guards _channel between the keeper and stop()
        self._channel: grpc.Channel | None = None  # the keeper's; closed by stop() to end a refresh at once

    def start(self) -> None:
        self._owner = asyncio.get_running_loop()
        self._heartbeat()
        self._thread = threading.Thread(target=self._keep_alive, name=f"etcd-lease-keepalive-{self.id:x}",
                                        daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        self._beat = self._kv._clock.monotonic()
        assert self._owner is not None
        self._beating = self._owner.call_later(self._interval, self._heartbeat)

    async def stop(self) -> None:
        """Stop the keeper and wait for its thread (a refresh waiting on etcd is cancelled)."""
        if self._beating is not None:
            self._beating.cancel()
            self._beating = None
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self._close_channel()
        if thread is not threading.current_thread():
            await asyncio.to_thread(thread.join, self._kv.settings.request_timeout_s * 2)

    def _report_lost(self, reason: str) -> None:
        """From the keeper: mark the lease lost on the owner's loop (whenever it next runs)."""
        _log.error("lease %#x lost: %s", self.id, reason)
        if self._owner is not None:
            with contextlib.suppress(RuntimeError):  # the owner's loop is closed: nobody to tell
                self._owner.call_soon_threadsafe(self.mark_lost, reason)

    def _close_channel(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()  # a refresh waiting on etcd ends with CANCELLED

    def _refresh(self, keep_alive: Any) -> Any:
        """One keep-alive, a unary call on LeaseKeepAlive (``keep_alive``): etcd's answer, waited
        for at most ``min(request_timeout_s, TTL / 3)``."""
        timeout = min(self._kv.settings.request_timeout_s, self._interval)
        try:
            return keep_alive(aetcd.rpc.LeaseKeepAliveRequest(ID=self.id), timeout=timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise KVUnavailable(f"etcd did not answer a keep-alive within {timeout:.1f}s") from None
            raise KVUnavailable(f"keep-alive of lease {self.id:#x}: {_describe(e)}") from e

    async def revoke(self) -> None:
        if self.revoked:
            return
        self.revoked = True
        await self.stop()
        self._kv._leases.discard(self)
        if self.lost.is_set():
            return
        with _translate(f"revoke of lease {self.id:#x}"):
            await self._kv._client.revoke_lease(self.id)

    def _keep_alive(self) -> None:
        """The keeper thread: a refresh every TTL / 3 until stopped, lost, or the owner wedged."""
        s = self._kv.settings
        channel = grpc.insecure_channel(s.endpoint, options=[
            ("grpc.keepalive_time_ms", s.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", s.keepalive_timeout_ms),
        ])
        with self._lock:
            if self._stopping.is_set():
                channel.close()
                return
            self._channel = channel
        keep_alive = channel.unary_unary(
            "/etcdserverpb.Lease/LeaseKeepAlive",
            request_serializer=aetcd.rpc.LeaseKeepAliveRequest.SerializeToString,
            response_deserializer=aetcd.rpc.LeaseKeepAliveResponse.FromString)
        try:
            self._keep_alive_on(keep_alive)
        finally:
            self._close_channel()

    def _keep_alive_on(self, keep_alive: Any) -> None:
        clock = self._kv._clock
        limit = self._kv.settings.loop_stall_limit_s
        last_ok = clock.monotonic()
        while not self._stopping.wait(self._interval):
            stalled = clock.monotonic() - self._beat
            if stalled > limit:  # a wedged owner must not keep its record alive: let etcd expire it
                self._report_lost(f"its event loop has not run for {stalled:.1f}s (limit {limit:.0f}s)")
                return
            try:
                reply = self._refresh(keep_alive)
            except KVError as e:
                if self._stopping.is_set():
                    return
                silent_for = clock.monotonic() - last_ok
                if silent_for >= self.ttl:
                    self._report_lost(f"no keep-alive succeeded for {silent_for:.1f}s: {e}")
                    return
                _log.warning("keep-alive of lease %#x failed, retrying: %s", self.id, e)
                continue
            if reply.TTL <= 0:
                self._report_lost("etcd reports the lease expired")
                return
            last_ok = clock.monotonic()


class EtcdKV:
    """:class:`~metricsd.cluster.kv.KV` on one etcd endpoint. Use from one event loop.

    Connections are opened lazily and re-established by gRPC after an outage, so an ``EtcdKV``
    made while etcd is down starts working when it comes up.
    """

    def __init__(self, settings: EtcdSettings | None = None, *, clock: Clock | None = None) -> None:
        self.settings = settings or EtcdSettings()
        self._clock: Clock = clock or SystemClock()
        self._client = self._new_client()
        self._leases: set[_EtcdLease] = set()
        self._closed = False

    @classmethod
    def from_endpoint(cls, endpoint: str, **kwargs: Any) -> EtcdKV:
        """``EtcdKV.from_endpoint("127.0.0.1:2379", request_timeout_s=2.0)``."""
        return cls(EtcdSettings(endpoint=endpoint, **kwargs))

    def _new_client(self) -> Any:
        s = self.settings
        return aetcd.Client(
            host=s.host,
            port=s.port,
            timeout=s.request_timeout_s,  # aetcd hints int; gRPC takes a float deadline
            options={
                "grpc.keepalive_time_ms": s.keepalive_time_ms,
                "grpc.keepalive_timeout_ms": s.keepalive_timeout_ms,
            },
            connect_wait_timeout=max(1, int(s.request_timeout_s)),
        )

    async def get(self, key: str) -> Versioned | None:
        with _translate(f"get {key!r}"):
            kv = await self._client.get(key.encode())
        return None if kv is None else Versioned(kv.value, kv.mod_revision)

    async def range(self, prefix: str) -> RangeResult:
        with _translate(f"range {prefix!r}"):
            result = await self._client.get_prefix(prefix.encode(), sort_order="ascend", sort_target="key")
        items = [KeyValue(kv.key.decode(), kv.value, kv.mod_revision) for kv in result.kvs]
        return RangeResult(items, result.header.revision)

    async def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        with _translate(f"put {key!r}"):
            result = await self._client.put(key.encode(), value, lease=_lease_id(lease))
        return int(result.header.revision)

    async def delete(self, key: str) -> bool:
        with _translate(f"delete {key!r}"):
            result = await self._client.delete(key.encode())
        return result is not None

    async def compare_and_swap(
        self,
        key: str,
        expected_mod_revision: int,
        value: bytes,
        lease: Lease | None = None,
        guards: Mapping[str, int] | None = None,
    ) -> bool:
        t = self._client.transactions
        compare = [t.mod(key.encode()) == expected_mod_revision]
        compare += [t.mod(k.encode()) == rev for k, rev in (guards or {}).items()]
        with _translate(f"compare-and-swap {key!r}"):
            ok, _ = await self._client.transaction(
                compare=compare, success=[t.put(key.encode(), value, lease=_lease_id(lease))], failure=[]
            )
        return bool(ok)

    async def compare_and_delete(self, key: str, expected_mod_revision: int) -> bool:
        t = self._client.transactions
        with _translate(f"compare-and-delete {key!r}"):
            ok, _ = await self._client.transaction(
                compare=[t.mod(key.encode()) == expected_mod_revision],
                success=[t.delete(key.encode())],
                failure=[],
            )
        return bool(ok)

    async def revoke_lease_id(self, lease_id: int) -> None:
        """Revoke a lease held by someone else (an operator evicting a member; tests)."""
        with _translate(f"revoke of lease {lease_id:#x}"):
            await self._client.revoke_lease(lease_id)

    async def compact(self, revision: int) -> None:
        """Drop history before ``revision`` (etcd-only; for tests and maintenance)."""
        with _translate(f"compact to {revision}"):
            await self._client.compact(revision, physical=True)

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        if start_revision < 1:
            raise ValueError(
                f"watch needs a start revision >= 1 (got {start_revision}): read the prefix with range() "
                "and watch from its revision + 1, so no change can slip between the read and the watch"
            )
        s = self.settings
        next_revision = start_revision
        backoff = s.watch_backoff_initial_s
        while not self._closed:
            client = self._new_client()
            try:
                stream = await client.watch_prefix(prefix.encode(), start_revision=next_revision)
                backoff = s.watch_backoff_initial_s
                async for raw in stream:
                    event = WatchEvent(
                        EventType.PUT if raw.kind == "PUT" else EventType.DELETE,
                        raw.kv.key.decode(),
                        raw.kv.value if raw.kind == "PUT" else b"",
                        raw.kv.mod_revision,
                    )
                    next_revision = event.mod_revision + 1
                    yield event
                reason = "the stream ended"
            except aetcd.exceptions.RevisionCompactedError as e:
                raise WatchCompacted(prefix, next_revision, e.compacted_revision) from e
            except (*_UNAVAILABLE, aetcd.exceptions.ClientError) as e:
                reason = _describe(e)
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(s.request_timeout_s):
                        await client.close()
            if self._closed:
                return
            _log.warning(
                "watch of %r interrupted (%s); re-subscribing from revision %d in %.2fs",
                prefix,
                reason,
                next_revision,
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, s.watch_backoff_max_s)

    async def grant(self, ttl: int, on_lost: LeaseLostCallback | None = None) -> Lease:
        if ttl < 1:
            raise ValueError(f"a lease needs a TTL of at least 1 second, got {ttl}")
        with _translate(f"grant of a {ttl}s lease"):
            granted = await self._client.lease(ttl)
        lease = _EtcdLease(self, granted.id, int(granted.ttl), on_lost)
        self._leases.add(lease)
        lease.start()
        return lease

    async def close(self) -> None:
        self._closed = True
        for lease in list(self._leases):
            await lease.stop()
        self._leases.clear()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.settings.request_timeout_s):
                await self._client.close()

    async def __aenter__(self) -> EtcdKV:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _lease_id(lease: Lease | None) -> int | None:
    if lease is None:
        return None
    if not lease.alive:
        raise KVError(f"cannot write with {lease!r}: grant a new lease")
    return lease.id
