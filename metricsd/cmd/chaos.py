"""``metricsd chaos``: a local cluster under faults, proving that nothing acknowledged is lost.

It starts a cluster on loopback (metricsd/cmd/cluster.py: etcd, stores with ``--data-dir``,
config servers, two proxies), writes continuously through both proxies while logging every
acknowledged sample, reads back a random pod every second, and meanwhile runs a seeded fault
schedule (chaosplan.py): stores killed with SIGKILL and restarted from their WAL (one at a time,
the next only once the last is level again: never more than RF - W replicas of a slot away), some
restarted on damaged files (a byte flipped in a snapshot and a WAL segment: it must find them and
copy what it lost from its peers), one under a launcher that is SIGKILLed (the store must end with
it), store-1's disk filled to the last byte for a while (its data on a 64 MiB tmpfs, as root),
etcd stopped for a while, a proxy killed. At the end it reads everything back and prints:
samples acknowledged, samples lost (must be 0), reads that failed while a read quorum was up (must
be 0), quorum reads that missed a sample acknowledged before they began (must be 0; each is logged
with what every store holds of the missed samples), how long each restarted store took to be level
again, and whether all replicas' digests agree, whether every damaged restart was reported and no
child outlived its launcher.
Exit code 0 only when all of these hold.

A writer retries a batch (idempotent: same timestamps and values) on the other proxy when its
own fails, as an agent does; a sample counts as acknowledged only when a proxy acknowledged it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from metricsd.cluster.chaosplan import AckLog, ChaosReport, Event, Workload, lost_samples, plan_events
from metricsd.cluster.etcd_kv import EtcdKV, EtcdSettings
from metricsd.cluster.shardmap import KeyLayout, MemberState, ShardMap
from metricsd.cmd.chaosfaults import (
    DAMAGE_FOUND,
    damage_store_files,
    launcher_killed,
    log_size,
    mentions_since,
    wait_handoff,
    wipe_dir,
)
from metricsd.cmd.clusterplan import ClusterPlan, ProcessSpec
from metricsd.cmd.diskfill import fill, mount_tmpfs, umount
from metricsd.cmd.launch import LocalCluster
from metricsd.cmd.ports import free_range
from metricsd.durations import parse_duration_ms
from metricsd.model import series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.proxy.members import RECONNECT_OPTIONS
from metricsd.rpc.channel import open_channel
from metricsd.rpc.server import GRPC_OPTIONS
from metricsd.rpc.wire import labels_to_pb

__all__ = ["ChaosOptions", "ChaosPlan", "add_parser", "run", "run_chaos"]

log = logging.getLogger("metricsd.chaos")

# A proxy's channel to a store that was down retries with back-off up to this (proxy/members.py).
PROXY_RECONNECT_S = dict(RECONNECT_OPTIONS)["grpc.max_reconnect_backoff_ms"] / 1000


@dataclass(frozen=True)
class ChaosPlan(ClusterPlan):
    """A ClusterPlan whose stores keep a WAL under ``store_root`` and run anti-entropy often."""

    store_root: str = ""
    sync_interval_s: float = 5.0
    snapshot_every_s: float = 60.0  # snapshots (and WAL segments) for the damaged-file faults to find

    def store_specs(self) -> list[ProcessSpec]:
        return [ProcessSpec(s.name, s.command, (*s.args, "--data-dir", f"{self.store_root}/{s.name}",
                                               "--sync-interval", str(self.sync_interval_s),
                                               "--snapshot-every", str(self.snapshot_every_s)), s.grpc_port)
                for s in super().store_specs()]


@dataclass(frozen=True)
class ChaosOptions:
    """What a run does; the defaults are the ten-minute run of perf/RESULTS.md."""

    duration_s: float = 600.0
    seed: int = 1
    stores: int = 4
    slots: int = 16
    pods: int = 60
    tick_s: float = 0.5
    base_port: int = 0  # 0: find a free range
    log_level: str = "INFO"
    secure: bool = True  # TLS (mutual) and tokens between every process, as cluster up runs them
    small_disk: bool = True  # store-1's data on a 64 MiB tmpfs, filled by the fill_disk faults (root only)
    # How long past duration_s the planned faults that have not started yet may still start (the
    # writers and the reader go on meanwhile). Each fault waits for the one before it to finish (a
    # restarted store level again), so on a loaded machine the last ones slip past the end; a short
    # run that must see every kind of fault (tests/cluster/test_cluster_chaos.py) gives them room.
    grace_s: float = 0.0


class Chaos:
    def __init__(self, opts: ChaosOptions, data_dir: Path) -> None:
        self.opts = opts
        self.data_dir = data_dir
        base = opts.base_port or free_range("127.0.0.1", 200)
        self.plan = ChaosPlan(base_port=base, stores=opts.stores, proxies=2, config_servers=2, slots=opts.slots,
                              rf=3, w=2, r=2, simulate=False, store_root=str(data_dir / "stores"),
                              security_dir=str(data_dir / "security") if opts.secure else "")
        self.cluster = LocalCluster(self.plan, data_dir, opts.log_level)
        self.workload = Workload(pods=opts.pods, writers=2, seed=opts.seed)
        self.rng = random.Random(opts.seed + 2)
        self.disk_store = f"store-{min(opts.stores, 1)}"
        self.disk_why_not = "not tried" if not opts.small_disk else ""
        self.acks = AckLog(path=str(data_dir / "acked.tsv"))
        self.report = ChaosReport()
        self.stop = asyncio.Event()
        self.faults_over = asyncio.Event()
        self.stores_down = 0
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.kv: EtcdKV | None = None
        self.t0 = 0.0
        self.first_ts = 0

    def stub(self, address: str) -> pb_grpc.MetricsStub:
        if address not in self._channels:
            security = self.plan.security.client("ops") if self.plan.security is not None else None
            self._channels[address] = open_channel(address, security, GRPC_OPTIONS + RECONNECT_OPTIONS)
        return pb_grpc.MetricsStub(self._channels[address])

    def proxies(self) -> list[str]:
        return [f"127.0.0.1:{self.plan.proxy_grpc_port(i)}" for i in (1, 2)]

    def store_address(self, name: str) -> str:
        return f"127.0.0.1:{self.plan.store_port(int(name.split('-')[1]))}"

    # --- load ------------------------------------------------------------------------------

    async def _send(self, req: pb.WriteRequest, labels: list[pb.SeriesLabels], home: int) -> bool:
        deadline = time.monotonic() + 60.0
        attempt = 0
        while time.monotonic() < deadline:
            address = self.proxies()[(home + attempt) % 2]
            try:
                resp = await self.stub(address).Write(req, timeout=5.0)
                if resp.unknown_ids:
                    full = pb.WriteRequest()
                    full.CopyFrom(req)
                    full.series.extend(labels)
                    resp = await self.stub(address).Write(full, timeout=5.0)
                if not resp.unknown_ids:
                    return True
            except grpc.aio.AioRpcError as e:
                log.debug("write via %s failed: %s", address, e.code().name)
            attempt += 1
            self.report.write_retries += 1
            await asyncio.sleep(0.1 if attempt % 2 else 0.5)
        return False

    async def writer(self, w: int) -> None:
        series = self.workload.series(w)
        index = np.array([i for i, _ in series], dtype=np.int64)
        ids = [series_id(lab) for _, lab in series]
        labels = [pb.SeriesLabels(id=sid, labels=labels_to_pb(lab)) for sid, (_, lab) in zip(ids, series, strict=True)]
        tick_ms = int(self.opts.tick_s * 1000)
        last = 0
        while not self.stop.is_set():
            ts = int(time.time() * 1000) // tick_ms * tick_ms
            if ts > last:
                last = ts
                req = pb.WriteRequest(ids=ids, counts=[1] * len(ids), timestamps=[ts] * len(ids),
                                      values=self.workload.values(index, ts).tolist())
                if await self._send(req, labels, w):
                    self.acks.ack(w, ts, len(ids))
                    self.report.write_batches += 1
                else:
                    self.report.batches_given_up += 1
            await asyncio.sleep(max(0.0, (last + tick_ms) / 1000 - time.time()))

    @staticmethod
    def pod_read(pod: int, start: int, end: int) -> pb.ReadRequest:
        return pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.EQ, name="namespace", value="chaos"),
                                        pb.Matcher(type=pb.Matcher.EQ, name="pod", value=f"pod-{pod}")],
                              start_ms=start, end_ms=end)

    async def read_pod(self, pod: int, start: int, end: int, order: list[str]) -> pb.ReadResponse | None:
        req = self.pod_read(pod, start, end)
        for address in order:
            try:
                return await self.stub(address).Read(req, timeout=10.0)
            except grpc.aio.AioRpcError as e:
                log.info("read via %s failed: %s %s", address, e.code().name, e.details())
        return None

    async def reader(self) -> None:
        rng = random.Random(self.opts.seed + 1)
        while not self.stop.is_set():
            await asyncio.sleep(1.0)
            pod = rng.randrange(self.opts.pods)
            writer = pod % 2
            known = list(self.acks.acked.get(writer, []))
            quorum_up = self.stores_down <= self.plan.rf - self.plan.r
            order = self.proxies()
            rng.shuffle(order)
            read_started = time.time()
            resp = await self.read_pod(pod, self.first_ts - 60_000, int(time.time() * 1000) + 60_000, order)
            self.report.reads += 1
            if resp is None:
                self.report.reads_failed += 1
                self.report.reads_failed_with_quorum += int(quorum_up)
                continue
            have = {s.id: set(s.timestamps) for s in resp.series}
            for m in range(self.workload.metrics):
                sid = series_id(self.workload.labels(pod, m))
                missing = sorted(set(known) - have.get(sid, set()))
                if missing:
                    self.report.reads_missing_acked += 1
                    await self.explain_miss(pod, sid, missing, read_started)
                    break

    async def explain_miss(self, pod: int, sid: int, missing: list[int], read_started: float) -> None:
        """Log what each store holds of the samples a quorum read left out, so that a miss can be
        traced to the replicas that answered (the read itself does not say which they were)."""
        req = self.pod_read(pod, missing[0], missing[-1])
        held = []
        for i in range(1, self.opts.stores + 1):
            name = f"store-{i}"
            try:
                got = await self.stub(self.store_address(name)).Read(req, timeout=5.0)
                ts = {t for s in got.series if s.id == sid for t in s.timestamps}
                held.append(f"{name} has {sum(t in ts for t in missing)}/{len(missing)}")
            except grpc.aio.AioRpcError as e:
                held.append(f"{name} {e.code().name}")
        log.warning("read of pod-%d (started %.3f) misses %d acknowledged samples of series %d (%s .. %s); "
                    "now: %s", pod, read_started, len(missing), sid, missing[0], missing[-1], ", ".join(held))

    # --- faults ----------------------------------------------------------------------------

    async def health(self, address: str) -> int:
        try:
            return int((await self.stub(address).Health(pb.HealthRequest(), timeout=2.0)).status)
        except grpc.aio.AioRpcError:
            return -1

    async def member_active(self, name: str) -> bool:
        """The shard map in etcd names the store active (it published that it is level) with slots."""
        if self.kv is None:
            self.kv = EtcdKV(EtcdSettings(endpoint=self.plan.etcd_endpoint))
        try:
            got = await self.kv.get(KeyLayout(cluster=self.plan.cluster).map_key)
        except Exception:  # etcd down: not known to be level
            return False
        if got is None:
            return False
        m = ShardMap.from_json(got.value)
        return name in m.members and m.members[name].state is MemberState.ACTIVE and bool(m.slots_of(name))

    async def wait_level(self, name: str, timeout_s: float = 180.0) -> float:
        """Seconds until the store answers SERVING and the map has it active with slots (a store
        whose slots moved away while it was down is level only once it has caught up new ones)."""
        t0 = time.monotonic()
        back_at: float | None = None
        while time.monotonic() - t0 < timeout_s:
            status = await self.health(self.store_address(name))
            if status >= 0 and back_at is None:
                back_at = time.monotonic()
            if status == pb.HealthResponse.SERVING and await self.member_active(name):
                took = time.monotonic() - t0
                if await self.health(self.store_address(name)) == pb.HealthResponse.SERVING:
                    # The proxies' channels to it may still be in their reconnect back-off (at most
                    # PROXY_RECONNECT_S after it answers): to them it is down until then, so it counts
                    # as down for the reads' quorum and the next fault waits.
                    assert back_at is not None
                    await asyncio.sleep(max(0.0, back_at + PROXY_RECONNECT_S - time.monotonic()))
                    self.stores_down -= 1
                    return took
            await asyncio.sleep(0.2)
        self.stores_down -= 1
        proc = self.cluster.procs.get(name)
        exited = f" (it exited with code {proc.returncode})" if proc is not None and proc.poll() is not None else ""
        raise RuntimeError(f"{name} not level within {timeout_s:.0f} s{exited}; see "
                           f"{self.cluster.log_dir / (name + '.log')}")

    def spec(self, name: str) -> ProcessSpec:
        return next(s for s in self.plan.specs() if s.name == name)

    async def fault(self, ev: Event) -> None:
        print(f"  {ev.describe()}", flush=True)
        self.report.events.append(ev.describe())
        if ev.kind == "stop_etcd":
            await asyncio.to_thread(self.cluster.etcd.stop)
            await asyncio.sleep(ev.down_s)
            await self.cluster.etcd.start_async()  # started from this thread: it ends with it
            return
        if ev.kind == "fill_disk":
            await self.fill_disk(ev)
            return
        proc = self.cluster.procs[ev.target]
        proc.kill()
        await asyncio.to_thread(proc.wait)
        store = ev.kind != "kill_proxy"
        if store:
            self.stores_down += 1
        data_dir = Path(self.plan.store_root) / ev.target
        log_from = log_size(self.cluster.log_path(ev.target))
        damaged: list[str] = []
        if ev.kind == "wipe_store":
            wipe_dir(data_dir)
        elif ev.kind == "corrupt_store":
            damaged = damage_store_files(data_dir, self.rng)
            print(f"    flipped a byte of {', '.join(damaged) or 'nothing (no files yet)'}", flush=True)
        elif ev.kind == "kill_launcher":
            await self.kill_launcher(ev)
        await asyncio.sleep(ev.down_s)
        self.cluster.spawn(self.spec(ev.target))
        if store:
            took = await self.wait_level(ev.target)
            self.report.level_s.append((ev.target, ev.down_s, took))
            print(f"    {ev.target} level again {took:.1f} s after its restart", flush=True)
        if damaged:
            self.report.corrupted_restarts += 1
            found = mentions_since(self.cluster.log_path(ev.target), log_from, DAMAGE_FOUND)
            self.report.corruptions_found += bool(found)
            print(f"    {ev.target} {'reported the damage' if found else 'did NOT report the damage'}", flush=True)

    async def fill_disk(self, ev: Event) -> None:
        """Fill ``ev.target``'s small filesystem for ``ev.down_s``, free it, wait for the hand-off."""
        if self.disk_why_not:
            self.report.skipped.append(f"{ev.describe()}: {self.disk_why_not}")
            print(f"    skipped: {self.disk_why_not}", flush=True)
            return
        log = self.cluster.log_path(ev.target)
        log_from = log_size(log)
        filler = await asyncio.to_thread(fill, Path(self.plan.store_root) / ev.target)
        self.report.disks_filled += 1
        await asyncio.sleep(ev.down_s)
        filler.unlink()
        refused = mentions_since(log, log_from, ("No space left on device",))
        self.report.disk_full_refusals += refused
        took = await wait_handoff(self.proxy_stats, 60.0)
        print(f"    {ev.target} refused {refused} writes while full; hand-off done {took:.1f} s after space returned",
              flush=True)

    async def proxy_stats(self) -> list[Mapping[str, int] | None]:
        out: list[Mapping[str, int] | None] = []
        for address in self.proxies():
            try:
                out.append(dict((await self.stub(address).Stats(pb.StatsRequest(), timeout=5.0)).rejected))
            except grpc.aio.AioRpcError:
                out.append(None)
        return out

    async def kill_launcher(self, ev: Event) -> None:
        """``ev.target`` under a launcher of its own, the launcher SIGKILLed: the store must end with it."""
        async def serving() -> bool:
            return await self.health(self.store_address(ev.target)) >= 0

        child, ended = await launcher_killed(self.spec(ev.target).argv(self.cluster.log_level),
                                             self.cluster.log_path(ev.target), serving)
        self.report.launcher_kills += 1
        self.report.orphans += not ended
        print(f"    {ev.target} (pid {child}) " + ("ended with its SIGKILLed launcher" if ended
                                                   else "OUTLIVED its SIGKILLed launcher: killed"), flush=True)

    async def faults(self, events: list[Event]) -> None:
        for ev in events:
            delay = self.t0 + ev.at_s - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.faults_over.wait(), delay)
            if self.faults_over.is_set():
                return
            await self.fault(ev)

    # --- checks ----------------------------------------------------------------------------

    async def read_back(self) -> dict[int, dict[int, float]]:
        index_of = {series_id(self.workload.labels(p, m)): p * self.workload.metrics + m
                    for p in range(self.opts.pods) for m in range(self.workload.metrics)}
        found: dict[int, dict[int, float]] = {}
        end = int(time.time() * 1000) + 60_000
        for pod in range(self.opts.pods):
            resp = None
            for _ in range(20):
                resp = await self.read_pod(pod, self.first_ts - 60_000, end, self.proxies())
                if resp is not None:
                    break
                await asyncio.sleep(1.0)
            if resp is None:
                raise RuntimeError(f"cannot read pod-{pod} back through either proxy")
            for s in resp.series:
                found[index_of.get(s.id, -1)] = dict(zip(s.timestamps, s.values, strict=True))
        return found

    async def digests_agree(self, start: int, end: int, timeout_s: float) -> tuple[bool, int, float]:
        kv = EtcdKV(EtcdSettings(endpoint=self.plan.etcd_endpoint))
        try:
            got = await kv.get(KeyLayout(cluster=self.plan.cluster).map_key)
        finally:
            await kv.close()
        assert got is not None
        shard_map = ShardMap.from_json(got.value)
        t0 = time.monotonic()
        while True:
            digests: dict[tuple[int, str], tuple[int, int, int]] = {}
            for member in shard_map.members:
                req = pb.DigestRequest(slots=pb.SlotFilter(slot_count=shard_map.num_slots,
                                                           slots=shard_map.slots_of(member)),
                                       start_ms=start, end_ms=end)
                try:
                    resp = await self.stub(shard_map.address(member)).Digest(req, timeout=30.0)
                except grpc.aio.AioRpcError:
                    continue
                for d in resp.slots:
                    digests[(d.slot, member)] = (d.series, d.samples, d.hash)
            differ = sum(len({digests.get((s, m)) for m in shard_map.replicas(s)}) != 1
                         for s in range(shard_map.num_slots))
            took = time.monotonic() - t0
            if differ == 0 or took > timeout_s:
                return differ == 0, differ, took
            await asyncio.sleep(1.0)

    # --- the run ---------------------------------------------------------------------------

    async def run(self) -> ChaosReport:
        opts = self.opts
        events = [e for e in plan_events(opts.seed, opts.duration_s, opts.stores, 2, disk_store=self.disk_store)
                  if e.at_s < opts.duration_s]
        print(f"starting a cluster in {self.data_dir} (base port {self.plan.base_port}); {len(events)} faults "
              "planned", flush=True)
        disk = Path(self.plan.store_root) / self.disk_store
        if opts.small_disk:
            self.disk_why_not = mount_tmpfs(disk, "64m")
            print(f"{self.disk_store}'s data on a 64 MiB tmpfs" if not self.disk_why_not
                  else f"no small disk for {self.disk_store} ({self.disk_why_not}): its fill_disk faults are skipped",
                  flush=True)
        try:
            await self.cluster.start(120.0)
        except BaseException:
            if opts.small_disk and not self.disk_why_not:
                umount(disk)
            raise
        background: list[asyncio.Future[None]] = []
        try:
            for name in [s.name for s in self.plan.store_specs()]:
                self.stores_down += 1
                await self.wait_level(name, 60.0)
            self.first_ts = int(time.time() * 1000)
            self.t0 = time.monotonic()
            tasks = [asyncio.ensure_future(self.writer(0)), asyncio.ensure_future(self.writer(1)),
                     asyncio.ensure_future(self.reader())]
            fault_task = asyncio.ensure_future(self.faults(events))
            background = [*tasks, fault_task]
            await asyncio.sleep(opts.duration_s)
            if opts.grace_s > 0 and not fault_task.done():
                print(f"faults still planned at the end: up to {opts.grace_s:g} s more for them", flush=True)
                await asyncio.wait([fault_task], timeout=opts.grace_s)
            self.faults_over.set()
            await fault_task  # an event under way finishes: its store comes back and levels
            self.stop.set()
            await asyncio.gather(*tasks)
            self.report.acknowledged = self.acks.count(self.workload)
            print("faults over; waiting for hand-off and anti-entropy, then reading everything back", flush=True)
            await asyncio.sleep(3.0)
            found = await self.read_back()
            self.report.lost = len(lost_samples(self.workload, self.acks, found))
            last = max((ts for v in self.acks.acked.values() for ts in v), default=self.first_ts)
            ok, differ, took = await self.digests_agree(self.first_ts - 60_000, last + 1000, 120.0)
            self.report.digests_agree, self.report.digest_slots_differing, self.report.converge_s = ok, differ, took
            return self.report
        finally:
            # A failed fault (a store that never levels) ends the run early: the writers and the
            # reader must stop before their channels close, or each dies on a closed channel.
            self.stop.set()
            self.faults_over.set()
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for ch in self._channels.values():
                await ch.close(None)
            if self.kv is not None:
                await self.kv.close()
            await asyncio.to_thread(self.cluster.stop)
            if opts.small_disk and not self.disk_why_not:
                umount(disk)


def run_chaos(opts: ChaosOptions, data_dir: Path | None = None) -> ChaosReport:
    """Run the whole thing in a new event loop; raises RuntimeError when the cluster cannot start."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="metricsd-chaos-")
        data_dir = Path(tmp.name)
    try:
        report = asyncio.run(Chaos(opts, data_dir).run())
        (data_dir / "chaos.json").write_text(json.dumps(report.__dict__, default=str, indent=1))
        return report
    finally:
        if tmp is not None:
            tmp.cleanup()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", default="10m", help="how long faults run, e.g. 60s, 10m (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seeds the fault schedule and the data (default %(default)s)")
    p.add_argument("--plaintext", action="store_true", help="run the cluster without TLS and tokens")
    p.add_argument("--no-small-disk", action="store_true",
                   help="do not put store-1's data on a 64 MiB tmpfs (mounting one needs root; its data is gone "
                        "when the run ends), so no full-disk faults")
    p.add_argument("--stores", type=int, default=4, help="store processes (default %(default)s)")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--pods", type=int, default=60, help="pods written, 2 series each (default %(default)s)")
    p.add_argument("--base-port", type=int, default=0, help="ports from here (default: a free range)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="keep stores' data, logs and the acknowledged-sample log here (default: a temporary "
                        "directory removed at exit)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chaos", help="a local cluster under SIGKILLs and outages; checks nothing acknowledged is lost")
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        opts = ChaosOptions(duration_s=parse_duration_ms(args.duration) / 1000, seed=args.seed, stores=args.stores,
                            slots=args.slots, pods=args.pods, base_port=args.base_port,
                            log_level=getattr(args, "log_level", "INFO"), secure=not args.plaintext,
                            small_disk=not args.no_small_disk)
        for ev in plan_events(opts.seed, opts.duration_s, opts.stores, 2):
            log.debug("planned: %s", ev.describe())
        report = run_chaos(opts, args.data_dir)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"metricsd chaos: {e}", file=sys.stderr)
        return 1
    print("\n".join(report.lines(opts)), flush=True)
    return 0 if report.ok else 1
