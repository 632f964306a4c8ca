"""``metricsd cluster status``: members, slots per member, the map version, the leader, health.

Everything comes from etcd (the map, the member records, the leader key) plus one Health call
per member, so it works from any host that reaches etcd and the stores.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from metricsd.cluster.kv import KV, KVError
from metricsd.cluster.shardmap import KeyLayout, Member, ShardMap, ShardMapError
from metricsd.cmd import eventloop
from metricsd.cmd.runner import add_etcd_arguments, etcd_from_args, layout_from_args
from metricsd.cmd.security import add_client_arguments, client_from_args
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend
from metricsd.security.settings import ClientSecurity

__all__ = ["ClusterStatus", "add_status_arguments", "format_status", "read_status", "run_status"]


@dataclass
class ClusterStatus:
    shard_map: ShardMap | None
    map_error: str
    members: dict[str, Member]
    leader: str | None
    health: dict[str, str]  # member id -> SERVING / NOT_SERVING / "unreachable: ..."


async def member_health(address: str, timeout_s: float, security: ClientSecurity | None = None) -> str:
    async with open_channel(address, security) as channel:
        try:
            resp = await GrpcBackend(pb_grpc.MetricsStub(channel), timeout_s).health()
        except Exception as e:  # any failure is a status to print, not a crash
            return f"unreachable ({type(e).__name__})"
    return str(pb.HealthResponse.Status.Name(resp.status))


async def read_status(kv: KV, layout: KeyLayout, timeout_s: float = 2.0, security: ClientSecurity | None = None
                      ) -> ClusterStatus:
    """Raises KVError when etcd cannot be read."""
    stored = await kv.get(layout.map_key)
    shard_map, map_error = None, ""
    if stored is not None:
        try:
            shard_map = ShardMap.from_json(stored.value)
        except ShardMapError as e:
            map_error = str(e)
    records = await kv.range(layout.members_prefix)
    members, errors = layout.members_from((i.key, i.value) for i in records.items)
    if errors:
        map_error = "; ".join([map_error, *errors]).strip("; ")
    leader_kv = await kv.get(layout.leader_key)
    leader = None if leader_kv is None else leader_kv.value.decode(errors="replace")
    addresses = {m.id: m.address for m in members.values()}
    if shard_map is not None:
        for m in shard_map.members.values():
            addresses.setdefault(m.id, m.address)
    ids = sorted(addresses)
    results = await asyncio.gather(*(member_health(addresses[i], timeout_s, security) for i in ids))
    return ClusterStatus(shard_map, map_error, members, leader, dict(zip(ids, results, strict=True)))


def format_status(st: ClusterStatus, layout: KeyLayout) -> str:
    lines = [f"cluster {layout.cluster} ({layout.base})", f"config server leader: {st.leader or 'none'}"]
    m = st.shard_map
    if m is None:
        lines.append("shard map: none yet" + (f" ({st.map_error})" if st.map_error else ""))
    else:
        empty = sum(1 for r in m.slots if not r)
        short = sum(1 for r in m.slots if 0 < len(r) < m.rf)
        lines.append(f"shard map: version {m.version}, {m.num_slots} slots, rf {m.rf}"
                     + (f", {empty} slots without replicas" if empty else "")
                     + (f", {short} slots with fewer than rf replicas" if short else ""))
        if st.map_error:
            lines.append(f"warning: {st.map_error}")
    first: Mapping[str, int] = {}
    if m is not None:
        counts: dict[str, int] = {}
        for replicas in m.slots:
            if replicas:
                counts[replicas[0]] = counts.get(replicas[0], 0) + 1
        first = counts
    load = m.load() if m is not None else {}
    ids = sorted(set(st.members) | set(m.members if m is not None else ()))
    rows = [("MEMBER", "ADDRESS", "STATE", "REGISTERED", "SLOTS", "FIRST", "HEALTH")]
    for mid in ids:
        rec = st.members.get(mid) or (m.members[mid] if m is not None else None)
        assert rec is not None
        rows.append((mid, rec.address, rec.state.value, "yes" if mid in st.members else "no (lease expired)",
                     str(load.get(mid, 0)), str(first.get(mid, 0)), st.health.get(mid, "?")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    if len(rows) == 1:
        lines.append("(no members)")
    return "\n".join(lines)


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    add_etcd_arguments(p)
    p.add_argument("--health-timeout", type=float, default=2.0, help="seconds per member Health call")
    add_client_arguments(p)


async def _status(args: argparse.Namespace) -> int:
    kv = etcd_from_args(args)
    layout = layout_from_args(args)
    try:
        st = await read_status(kv, layout, args.health_timeout, client_from_args(args))
    except KVError as e:
        print(f"metricsd cluster status: {e}", file=sys.stderr)
        return 1
    finally:
        await kv.close()
    print(format_status(st, layout))
    return 0


def run_status(args: argparse.Namespace) -> int:
    return eventloop.run(_status(args))
