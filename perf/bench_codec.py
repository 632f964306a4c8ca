"""Chunk codec benchmark: bytes per sample and µs per chunk on a realistic pod-metrics mix.

Run: ``.venv/bin/python perf/bench_codec.py`` (about 30 s on 2 cores; ``--containers N`` to
change the size, default 1,250 containers = 10,000 series of one 120-sample chunk each;
``--source I`` to run only the I-th data source).

The mix is what cAdvisor and kube-state-metrics report per container, at a 10 s interval
(fixed seeds, so runs compare): a CPU seconds counter at microsecond resolution, working set
and RSS bytes in 4 KiB pages, an OOM counter, and constant CPU / memory requests and limits.
Three sources: a small generator in this file with 1-5 ms of jitter on 10% of the scrapes, and
``metricsd.agent.simulate`` without jitter and with up to 5 ms of jitter on every scrape.

Candidates:
  columnar      metricsd.codec as shipped (per-chunk choice of encodings, CRC32 included)
  columnar-xor  the same layout with decimal detection off: floats always XOR'd (lz4 or packed)
  gorilla       Gorilla as in the paper (delta-of-delta buckets, XOR with reused windows),
                bit-exact size from a reference encoder written with a loop per sample
  gorilla+lz4   the same bytes through lz4 when that is smaller
Encode / decode µs: one timed call per chunk after a warm-up call; mean and median over chunks.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator

import lz4.block
import numpy as np

from metricsd.codec import decode_chunk, encode_chunk
from metricsd.codec.timestamps import TsCode, encode_timestamps
from metricsd.codec.values import ValueCode, encode_values

SAMPLES = 120
INTERVAL_MS = 10_000
PAGE = 4096
MIB = 1 << 20

Series = tuple[str, np.ndarray, np.ndarray]


def _timestamps(rng: np.random.Generator, start: int, jitter_share: float) -> np.ndarray:
    t = start + np.arange(SAMPLES, dtype=np.int64) * INTERVAL_MS
    jittered = rng.random(SAMPLES) < jitter_share
    t[jittered] += rng.integers(-5, 6, int(jittered.sum()))
    return t


def _memory(rng: np.random.Generator, base_bytes: float) -> np.ndarray:
    """Pages that drift slowly (a random walk) with scrape-to-scrape noise, times 4096."""
    pages = base_bytes / PAGE
    walk = np.cumsum(rng.normal(0, pages * 0.002, SAMPLES))
    noise = rng.normal(0, pages * 0.001, SAMPLES)
    return np.maximum(np.rint(pages + walk + noise), 1) * PAGE


def generate(containers: int, seed: int = 7, jitter_share: float = 0.1) -> Iterator[Series]:
    """The realistic mix: 8 series per container, one chunk each, sharing the container's timestamps."""
    rng = np.random.default_rng(seed)
    start0 = 1_700_000_000_000
    for _ in range(containers):
        t = _timestamps(rng, start0 + int(rng.integers(0, INTERVAL_MS)), jitter_share)
        cores = rng.uniform(0.05, 2.0)
        usec = np.rint(cores * INTERVAL_MS * 1000 * np.clip(rng.normal(1, 0.3, SAMPLES), 0, None))
        cpu_start = int(rng.integers(0, 3600 * 24)) * 1_000_000 * cores
        yield "container_cpu_usage_seconds_total", t, (np.rint(cpu_start) + np.cumsum(usec)) / 1e6
        ws = _memory(rng, rng.uniform(50, 2048) * MIB)
        yield "container_memory_working_set_bytes", t, ws
        yield "container_memory_rss", t, np.maximum(ws - _memory(rng, 20 * MIB), PAGE)
        ooms = np.full(SAMPLES, float(rng.choice([0, 0, 0, 1, 2])))
        if rng.random() < 0.05:
            ooms[int(rng.integers(1, SAMPLES)) :] += 1
        yield "container_oom_events_total", t, ooms
        req_cpu = float(rng.choice([0.1, 0.25, 0.5, 1.0, 2.0]))
        req_mem = float(rng.choice([128, 256, 512, 1024, 4096])) * MIB
        yield "kube_pod_container_resource_requests{cpu}", t, np.full(SAMPLES, req_cpu)
        yield "kube_pod_container_resource_limits{cpu}", t, np.full(SAMPLES, 2 * req_cpu)
        yield "kube_pod_container_resource_requests{memory}", t, np.full(SAMPLES, req_mem)
        yield "kube_pod_container_resource_limits{memory}", t, np.full(SAMPLES, 2 * req_mem)


# --- Gorilla, as in the paper (reference: size only, one Python loop per sample) ---------------


class _Bits:
    def __init__(self) -> None:
        self.acc = 0
        self.n = 0

    def put(self, value: int, width: int) -> None:
        self.acc = (self.acc << width) | (value & ((1 << width) - 1))
        self.n += width

    def put2(self, a: int, wa: int, b: int, wb: int) -> None:
        self.put(a, wa)
        self.put(b, wb)

    def tobytes(self) -> bytes:
        pad = -self.n % 8
        return (self.acc << pad).to_bytes((self.n + pad) // 8, "big")


def gorilla_paper(t: np.ndarray, v: np.ndarray) -> bytes:
    """Timestamps: 64-bit first, 14-bit first delta, then '0' / '10'+7 / '110'+9 / '1110'+12 /
    '1111'+32 delta-of-delta buckets. Values: 64-bit first, then '0' for an equal value, '10' +
    the meaningful bits in the previous window, or '11' + 5-bit leading zeros + 6-bit length +
    the meaningful bits. A 2-byte sample count in front, as Prometheus' XOR chunk has."""
    b = _Bits()
    b.put(len(t), 16)
    ts = t.tolist()
    xs = v.view(np.uint64).tolist()
    b.put(ts[0], 64)
    b.put(xs[0], 64)
    prev_delta = 0
    lead, trail = 65, 65
    for i in range(1, len(ts)):
        delta = ts[i] - ts[i - 1]
        dod = delta - prev_delta
        if i == 1:
            b.put(delta, 14) if delta < 1 << 14 else b.put2(0x3FFF, 14, delta, 64)
        elif dod == 0:
            b.put(0, 1)
        elif -63 <= dod <= 64:
            b.put2(0b10, 2, dod, 7)
        elif -255 <= dod <= 256:
            b.put2(0b110, 3, dod, 9)
        elif -2047 <= dod <= 2048:
            b.put2(0b1110, 4, dod, 12)
        else:
            b.put2(0b1111, 4, dod, 32 if -(1 << 31) <= dod < 1 << 31 else 64)
        prev_delta = delta
        x = xs[i] ^ xs[i - 1]
        if x == 0:
            b.put(0, 1)
            continue
        lz = min(64 - x.bit_length(), 31)
        tz = (x & -x).bit_length() - 1
        if lz >= lead and tz >= trail:
            b.put(0b10, 2)
            b.put(x >> trail, 64 - lead - trail)
        else:
            lead, trail = lz, tz
            sig = 64 - lz - tz
            b.put2(0b11, 2, lz, 5)
            b.put2(sig & 63, 6, x >> tz, sig)
    return b.tobytes()


def gorilla_lz4(t: np.ndarray, v: np.ndarray) -> bytes:
    raw = gorilla_paper(t, v)
    packed = bytes(lz4.block.compress(raw, store_size=False))
    return b"\x01" + packed if len(packed) < len(raw) else b"\x00" + raw


def columnar_xor(t: np.ndarray, v: np.ndarray) -> bytes:
    """metricsd.codec's layout with values always XOR'd: what decimal detection buys."""
    min_t, max_t = int(t[0]), int(t[-1])
    tcode, tbody = encode_timestamps(t.view(np.uint64), min_t, max_t)
    vcode, vbody = encode_values(v, decimal=False)
    body = struct.pack("<BHqq", tcode << 4 | vcode, t.size, min_t, max_t) + tbody + vbody
    return body + struct.pack("<I", zlib.crc32(body))


Encoder = Callable[[np.ndarray, np.ndarray], bytes]
CANDIDATES: dict[str, tuple[Encoder, Callable[[bytes], object] | None]] = {
    "columnar": (encode_chunk, decode_chunk),
    "columnar-xor": (columnar_xor, decode_chunk),
    "gorilla": (gorilla_paper, None),
    "gorilla+lz4": (gorilla_lz4, None),
}


def simulated(containers: int, seed: int, jitter_ms: int) -> Iterator[Series]:
    """The same mix from metricsd.agent.simulate (one container per pod, plus node series)."""
    from metricsd.agent.simulate import METRICS, SimConfig, Simulator

    sim = Simulator(SimConfig(pods=containers, containers=1, seed=seed, jitter_ms=jitter_ms), 1_700_000_000_000)
    t, values = sim.block(SAMPLES)
    for metric in METRICS:
        cols = sim.columns(metric)
        for j in range(cols.start, cols.stop):
            yield metric, t, np.ascontiguousarray(values[:, j])


SOURCES: dict[str, Callable[[int, int], Iterator[Series]]] = {
    "own-mix (10% of scrapes 1-5 ms late or early)": lambda c, s: generate(c, s),
    "metricsd.agent.simulate, jitter_ms=0": lambda c, s: simulated(c, s, 0),
    "metricsd.agent.simulate, jitter_ms=5 (every scrape)": lambda c, s: simulated(c, s, 5),
}


def _verify(series: list[Series]) -> None:
    for _, t, v in series:
        t2, v2 = decode_chunk(encode_chunk(t, v))
        if not (np.array_equal(t, t2) and np.array_equal(v.view(np.uint64), v2.view(np.uint64))):
            raise SystemExit("round trip failed")


def _once_us(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1000


def run(title: str, series: list[Series]) -> None:
    _verify(series)
    n_samples = len(series) * SAMPLES
    print(f"== {title}: {len(series):,} series x {SAMPLES} samples = {n_samples:,} samples\n")
    names = list(CANDIDATES)
    per_metric: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    counts: dict[str, int] = defaultdict(int)
    enc_us: dict[str, list[float]] = defaultdict(list)
    dec_us: dict[str, list[float]] = defaultdict(list)
    metric_us: dict[str, list[tuple[float, float]]] = defaultdict(list)
    encodings: dict[int, int] = defaultdict(int)
    for metric, t, v in series:
        counts[metric] += SAMPLES
        for name in names:
            enc, dec = CANDIDATES[name]
            data = enc(t, v)  # warm-up, and the size
            per_metric[metric][name] += len(data)
            enc_us[name].append(_once_us(lambda e=enc, t=t, v=v: e(t, v)))  # type: ignore[misc]
            if dec is not None:
                dec_us[name].append(_once_us(lambda d=dec, b=data: d(b)))  # type: ignore[misc]
            if name == "columnar":
                encodings[data[0]] += 1
                metric_us[metric].append((enc_us[name][-1], dec_us[name][-1]))
    width = max(len(m) for m in per_metric) + 2
    cols = "".join(f"{n:>14}" for n in names)
    print("bytes per sample".ljust(width) + cols + f"{'enc µs':>9}{'dec µs':>9}  (columnar, mean)")
    for metric, sizes in per_metric.items():
        enc_mean = statistics.fmean(e for e, _ in metric_us[metric])
        dec_mean = statistics.fmean(d for _, d in metric_us[metric])
        row = "".join(f"{sizes[n] / counts[metric]:>14.3f}" for n in names)
        print(metric.ljust(width) + row + f"{enc_mean:>9.1f}{dec_mean:>9.1f}")
    totals = {n: sum(s[n] for s in per_metric.values()) for n in names}
    print("ALL (mix)".ljust(width) + "".join(f"{totals[n] / n_samples:>14.3f}" for n in names))
    print()
    print("µs per 120-sample chunk".ljust(width) + cols)
    for label, table in (("encode", enc_us), ("decode", dec_us)):
        for stat, fn in (("mean", statistics.fmean), ("median", statistics.median)):
            row = "".join(f"{fn(table[n]):>14.1f}" if table[n] else f"{'-':>14}" for n in names)
            print(f"{label} {stat}".ljust(width) + row)
    print("\ncolumnar encodings chosen (timestamp/value: share of chunks)")
    for code, k in sorted(encodings.items(), key=lambda kv: -kv[1]):
        print(f"  {TsCode(code >> 4).name}/{ValueCode(code & 15).name}: {k / len(series):.1%}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containers", type=int, default=1250, help="8 series each (default 1250)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--source", type=int, choices=range(len(SOURCES)), help="only this data source")
    args = parser.parse_args()
    for i, (title, make) in enumerate(SOURCES.items()):
        if args.source is None or args.source == i:
            run(title, list(make(args.containers, args.seed)))


if __name__ == "__main__":
    main()
