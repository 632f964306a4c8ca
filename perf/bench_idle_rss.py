"""The idle store process's RSS, split, for A/Bs of trees (a documented command, not a test).

    .venv/bin/python perf/bench_idle_rss.py                                   # this checkout, 3 rounds
    .venv/bin/python perf/bench_idle_rss.py --tree /tmp/base --tree . --rounds 4 --data-dir

perf/bench_rss_server.py reads the idle RSS of ``metricsd up --no-simulate --no-consumers`` once
before its ingest; this starts that process alone, trees alternated round by round (the same load
for each arm), and reads it 3 s after it answers HTTP: RSS as the kernel splits it (RssAnon,
RssFile), threads, and the mappings that hold the most. It also reads two interpreters that only
import: the third-party packages a store loads (the floor no lazy import of metricsd's moves) and
``metricsd.cmd.up`` (everything the command imports before it runs).

RssFile is mostly the shared libraries' pages, and how many of them a process maps depends on the
page cache, not on metricsd: files written recently (a fresh virtualenv) sit in the page cache as
large folios and a fault maps a whole folio, so the same code and packages read 45 MiB of RssFile
from a venv installed an hour before (a fresh clone's ``make``) and 32 MiB once those files were
dropped from the page cache and read back by the process's own faults, as a deployment's are after
a boot (perf/RESULTS.md, session 44). ``--evict-libraries`` drops the interpreter's shared objects
from the page cache first (``posix_fadvise(DONTNEED)``: clean pages, nothing is lost); arms must
use the same ``--python`` either way.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from procstat import mappings_kib, status_kib  # noqa: E402

from metricsd.ports import free_port  # noqa: E402

KINDS = ("VmRSS", "RssAnon", "RssFile", "Threads")
THIRD_PARTY = "numpy, grpc.aio, aiohttp.web, prometheus_client, promql_parser, cramjam, orjson, lz4.block, snappy"


def evict_libraries(prefix: str = sys.prefix) -> int:
    """Drop the page cache of every shared object under ``prefix`` (a venv's packages) and of the
    interpreter's own library; returns how many files. Each is read back by the next process's
    faults, as after a boot, instead of mapped as the large folios its install wrote."""
    paths = [p for p in Path(prefix).rglob("*.so*") if p.is_file()]
    paths += [p for p in Path(sys.base_prefix, "lib").glob("libpython*.so*") if p.is_file()]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(paths)


def mappings_mib(pid: int, top: int = 6) -> list[tuple[str, float]]:
    """The mappings holding the most resident memory, by file name (anonymous ones together), MiB."""
    rss: Counter[str] = Counter()
    for name, kib in mappings_kib(pid):
        rss[name.rsplit("/", 1)[-1]] += kib
    return [(n, k / 1024) for n, k in rss.most_common(top)]


def idle_store(python: str, tree: Path, data_dir: bool, settle_s: float = 3.0) -> dict[str, object]:
    """Start ``metricsd up`` from ``tree``, wait until it answers, read it, stop it."""
    grpc_port, http_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="metricsd-idle-") as tmp:
        argv = [python, "-m", "metricsd", "--log-level", "WARNING", "up", "--no-simulate", "--no-consumers",
                "--grpc-port", str(grpc_port), "--http-port", str(http_port)]
        if data_dir:
            argv += ["--data-dir", str(Path(tmp) / "data")]
        env = dict(os.environ, PYTHONPATH=str(tree))
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/v1/status/buildinfo", timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        err = proc.stderr.read() if proc.stderr is not None else b""
                        raise RuntimeError(f"metricsd up did not start: {err!r}") from None
                    time.sleep(0.1)
            time.sleep(settle_s)
            got = status_kib(proc.pid, KINDS)
            out: dict[str, object] = {k: got[k] / (1 if k == "Threads" else 1024) for k in KINDS}
            out["mappings"] = mappings_mib(proc.pid)
            return out
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def imports_only(python: str, tree: Path, statement: str) -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of an interpreter that ran ``statement``, MiB, and its modules."""
    code = (f"{statement}\nimport sys\ns = open('/proc/self/status').read()\n"
            "print(*(int(s.split(k + ':')[1].split()[0]) for k in ('VmRSS', 'RssAnon', 'RssFile')), len(sys.modules))")
    out = subprocess.run([python, "-c", code], env=dict(os.environ, PYTHONPATH=str(tree)), check=True,
                         capture_output=True, text=True).stdout.split()
    return {"VmRSS": int(out[0]) / 1024, "RssAnon": int(out[1]) / 1024, "RssFile": int(out[2]) / 1024,
            "modules": float(out[3])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, action="append", help="a checkout to put first on PYTHONPATH (repeat: arms)")
    p.add_argument("--python", default=sys.executable, help="the interpreter (its venv's packages)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data-dir", action="store_true", help="the store keeps a WAL and snapshots")
    p.add_argument("--evict-libraries", action="store_true",
                   help="drop --python's venv's shared objects from the page cache first")
    a = p.parse_args()
    trees = [t.resolve() for t in (a.tree or [HERE.parent])]
    if a.evict_libraries:
        venv = subprocess.run([a.python, "-c", "import sys; print(sys.prefix)"], check=True, capture_output=True,
                              text=True).stdout.strip()
        print(f"{evict_libraries(venv)} shared objects dropped from the page cache")
    print("| arm | round | VmRSS | RssAnon | RssFile | threads | largest mappings, MiB |")
    print(f"| {' | '.join(['---'] * 7)} |")
    for r in range(a.rounds):
        for t in trees:
            s = idle_store(a.python, t, a.data_dir)
            maps = ", ".join(f"{n} {m:.1f}" for n, m in s["mappings"])  # type: ignore[attr-defined]
            print(f"| {t} | {r + 1} | {s['VmRSS']:.1f} | {s['RssAnon']:.1f} | {s['RssFile']:.1f} | "
                  f"{s['Threads']:.0f} | {maps} |", flush=True)
    print("\n| arm | imports | VmRSS | RssAnon | RssFile | modules |\n| --- | --- | --- | --- | --- | --- |")
    for t in trees:
        for label, stmt in (("bare interpreter", "pass"), ("third-party packages", f"import {THIRD_PARTY}"),
                            ("metricsd.cmd.up", "import metricsd.cmd.up")):
            m = imports_only(a.python, t, stmt)
            print(f"| {t} | {label} | {m['VmRSS']:.1f} | {m['RssAnon']:.1f} | {m['RssFile']:.1f} | "
                  f"{m['modules']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
