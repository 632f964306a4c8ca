"""A real Prometheus' remote-write shape inside one store, in process (a documented command, not a test):

    .venv/bin/python perf/bench_ingest_store.py                     # 4,000 requests of ~500 samples
    PYTHONPATH=/tmp/base .venv/bin/python perf/bench_ingest_store.py  # the same against a `git archive`
    .venv/bin/python perf/bench_ingest_store.py --frames            # as a cluster store gets them from a proxy
    .venv/bin/python perf/bench_ingest_store.py --read-port         # those frames over a loopback read port

perf/bench_seal.py measures the agents' shape (the same 2,000 ids every tick, which the index's
batch memory answers); this is the other one. 10 targets x 1,000 pods x 4 series are "scraped"
every 2 s, each target's samples stamped with its scrape time plus 0-3 ms (so rows go wide, as a
real Prometheus' do), values moving but for the requests series; the samples are queued in scrape
order and cut into requests of 494-500 samples, so that no request's ids repeat an earlier one's
(a real Prometheus' batches never do: perf/RESULTS.md, issue 24 session 38). Each request goes
through StoreAPI.write_columns (admission, validate, apply) as the one store's receiver calls it,
after 40 scrapes of history. Prints the process CPU seconds per million samples of the measured
requests (decoding the remote-write body is not in it: that is the receiver's). With ``--frames``
each request is a WritePartsRequest of one part, as a proxy sends a store its part over the read
port, written through MetricsServicer.write_parts_body (the message decoded, the part written, the
answer serialised; the read port's framing and the event loop's turns are not in it). With
``--read-port`` the same frames go over a ReadPortServer on 127.0.0.1 (plaintext, no tokens) from a
plain asyncio client in this process, one frame at a time, as a proxy's writes to a store come when
a real Prometheus sends one request after another: the figure is both ends' CPU, the client's (a
write and a read of a frame) included.

Process CPU, not wall time, so a loaded machine skews it less; still run A and B alternately, more
than once: at load 10 one run moves +-10%.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator

import numpy as np

from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.columns import WriteColumns
from metricsd.rpc.frames import HEADER, Kind, Method, encode
from metricsd.rpc.readport import ReadPortServer
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import length_delimited
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

METRICS = ("container_cpu_usage_seconds_total", "container_memory_working_set_bytes",
           "container_network_receive_bytes_total", "kube_pod_container_resource_requests")


def scrapes(targets: int, pods: int, t0: int, rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray,
                                                                                          np.ndarray]]:
    """(series positions, timestamps, values) of each target's scrape, target after target."""
    per = pods * len(METRICS)
    vals = rng.random(targets * per) * 100
    moving = np.arange(per) % len(METRICS) != len(METRICS) - 1  # the requests series stay put
    k = 0
    while True:
        for t in range(targets):
            at = slice(t * per, (t + 1) * per)
            vals[at] += np.where(moving, rng.random(per), 0.0)
            stamp = t0 + 2000 * k + 150 * t + int(rng.integers(0, 4))
            yield np.arange(t * per, (t + 1) * per), np.full(per, stamp, np.int64), vals[at].copy()
        k += 1


def requests(targets: int, pods: int, t0: int, per: int, rng: np.random.Generator
             ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The scraped samples in order, cut into requests of ``per`` samples less 0-6."""
    queue: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    have = 0
    for scrape in scrapes(targets, pods, t0, rng):
        queue.append(scrape)
        have += len(scrape[0])
        while have >= per:
            pos, ts, vals = (np.concatenate(c) for c in zip(*queue, strict=True))
            cut = per - int(rng.integers(0, 7))
            yield pos[:cut], ts[:cut], vals[:cut]
            queue = [(pos[cut:], ts[cut:], vals[cut:])]
            have = len(pos) - cut


def run(n_requests: int, targets: int = 10, pods: int = 1000, per: int = 500, history: int = 40,
        frames: bool = False, read_port: bool = False) -> float:
    rng = np.random.default_rng(0)
    labels: list[Labels] = [make_labels(m, {"namespace": f"ns{t}", "pod": f"pod-{t}-{p}", "container": "c",
                                            "node": f"n{p % 7}"})
                            for t in range(targets) for p in range(pods) for m in METRICS]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    api = StoreAPI(Store())
    span = history + n_requests * per // len(ids) + 10  # scrapes in all, so the newest is about now
    t0 = (int(time.time() * 1000) // 2000) * 2000 - 2000 * span
    known = np.zeros(len(ids), bool)
    source = requests(targets, pods, t0, per, rng)

    def batch() -> WriteColumns:
        pos, ts, vals = next(source)
        new = pos[~known[pos]]
        known[new] = True
        return WriteColumns(ids[pos], np.ones(len(pos), np.int64), ts, vals,
                            {int(ids[i]): labels[i] for i in new.tolist()})

    for _ in range(history * len(ids) // per):
        api.write_columns(batch())
    batches = [batch() for _ in range(n_requests)]
    if frames or read_port:
        servicer = MetricsServicer(LocalBackend(api), writes_in_turn=True)  # as cmd/store.py's
        bodies = [length_delimited(1, b.wire()) for b in batches]

        async def write_all() -> int:
            answers = [pb.WritePartsResponse.FromString(await servicer.write_parts_body(body, "127.0.0.1"))
                       for body in bodies]
            return sum(a.results[0].response.samples_written for a in answers)

        async def over_port() -> int:
            server = ReadPortServer(LocalBackend(api), write_parts=servicer.write_parts_body)
            reader, writer = await asyncio.open_connection("127.0.0.1", await server.start("127.0.0.1", 0))
            writer.write(encode(Kind.HELLO, 0, 0, b""))
            await reader.readexactly(HEADER.size)
            written = 0
            for i, body in enumerate(bodies):
                writer.write(encode(Kind.REQUEST, i + 1, Method.WRITE_PARTS, body))
                length, _, kind, _, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
                answer = await reader.readexactly(length)
                if kind != Kind.RESPONSE:
                    raise RuntimeError(f"frame {i + 1}: {answer.decode(errors='replace')}")
                written += pb.WritePartsResponse.FromString(answer).results[0].response.samples_written
            writer.close()
            await server.stop()
            return written

        c = time.process_time()
        written = asyncio.run(over_port() if read_port else write_all())
    else:
        c = time.process_time()
        written = sum(api.write_columns(b).samples_written for b in batches)
    spent = time.process_time() - c
    if written != sum(len(b.ids) for b in batches):
        raise RuntimeError(f"{written} samples written of {sum(len(b.ids) for b in batches)}")
    return spent / written * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4000, help="measured requests")
    ap.add_argument("--frames", action="store_true", help="as WriteParts frames through the store's servicer")
    ap.add_argument("--read-port", action="store_true", help="those frames over a loopback read port")
    args = ap.parse_args()
    how = "frames over a read port" if args.read_port else "WriteParts frames" if args.frames else "requests"
    print(f"store, a real Prometheus' shape (40,000 series, ~500-sample {how} that never repeat): "
          f"{run(args.requests, frames=args.frames, read_port=args.read_port):.3f} CPU s per million samples")


if __name__ == "__main__":
    main()
