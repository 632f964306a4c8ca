"""Run Prometheus' PromQL test scripts against a backend, eval by eval.

Every ``load`` and ``clear`` is applied; only the evals asked for are run (the in-subset ones
from ``evals_index.tsv``). Run as a script to print pass counts per file:
``.venv/bin/python tests/promql/promql_script_runner.py [backend]``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from promql_script_backend import BACKENDS, Backend, LoadSeries
from promql_script_check import check_eval, check_range_cross, wants_range_cross
from promql_script_format import HISTOGRAM, ClearCmd, EvalCmd, LoadCmd, parse_script

__all__ = ["TESTDATA", "known_gaps", "load_series", "run_file", "subset_evals"]

HERE = Path(__file__).resolve().parent
TESTDATA = Path(os.environ.get("METRICSD_PROMQL_TESTDATA", HERE.parents[2] / "shared" / "peer" / "promql"))
KNOWN_GAPS = HERE / "known_gaps.txt"


def subset_evals(index: Path | None = None) -> dict[str, set[int]]:
    """file -> line numbers of the evals marked in_subset=yes."""
    out: dict[str, set[int]] = {}
    with open(index or TESTDATA / "evals_index.tsv", encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        col = {name: i for i, name in enumerate(header)}
        for row in f:
            cells = row.rstrip("\n").split("\t")
            if cells[col["in_subset"]] == "yes":
                out.setdefault(cells[col["file"]], set()).add(int(cells[col["line"]]))
    return out


def known_gaps(path: Path = KNOWN_GAPS, backend: str | None = None) -> dict[tuple[str, int], str]:
    """``file:line  reason`` lines; ``#`` starts a comment. A reason starting ``[name]`` is a gap
    of that backend only: with ``backend`` given, other backends' gaps are left out."""
    out: dict[tuple[str, int], str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where, _, reason = line.partition(" ")
        file, _, lineno = where.partition(":")
        reason = reason.strip()
        if backend is not None and reason.startswith("[") and not reason.startswith(f"[{backend}]"):
            continue
        out[(file, int(lineno))] = reason
    return out


def load_series(cmd: LoadCmd) -> list[LoadSeries]:
    out: list[LoadSeries] = []
    for labels, values in cmd.series.items():
        ts = [k * cmd.step_ms for k, v in enumerate(values) if v is not None and v is not HISTOGRAM]
        vs = [v for v in values if v is not None and v is not HISTOGRAM]
        if ts:
            out.append((labels, np.asarray(ts, dtype=np.int64), np.asarray(vs, dtype=np.float64)))
    return out


def run_file(
    path: Path, backend: Backend, lines: Iterable[int], *, range_cross_check: bool = True
) -> dict[int, str | None]:
    """Run the evals at ``lines``; returns line -> None (passed) or the reason it failed.

    With ``range_cross_check`` an instant eval that passed is also run as a range query from
    t-1m to t+1m, whose points at t must meet the same expectations (README section 10.1).
    """
    wanted = set(lines)
    results: dict[int, str | None] = {}
    for cmd in parse_script(path.read_text(encoding="utf-8")):
        if isinstance(cmd, ClearCmd):
            backend.clear()
        elif isinstance(cmd, LoadCmd):
            backend.load(load_series(cmd))
        elif isinstance(cmd, EvalCmd) and cmd.line in wanted:
            try:
                if cmd.range:
                    resp = backend.range(cmd.expr, cmd.start_ms, cmd.end_ms, cmd.step_ms)
                else:
                    at = cmd.range_vector[1] if cmd.range_vector else cmd.time_ms
                    resp = backend.instant(cmd.expr, at)
                results[cmd.line] = check_eval(cmd, resp)
                if results[cmd.line] is None and range_cross_check and wants_range_cross(cmd):
                    t = cmd.time_ms
                    resp = backend.range(cmd.expr, t - 60_000, t + 60_000, 60_000)
                    results[cmd.line] = check_range_cross(cmd, resp)
            except Exception as e:  # a crash is a failed eval, reported with its cause
                results[cmd.line] = f"crashed: {type(e).__name__}: {e}"
    return results


def main(argv: list[str]) -> int:
    backend_name = argv[1] if len(argv) > 1 else "inprocess"
    gaps = known_gaps(backend=backend_name)
    total_pass = total = 0
    for file, lines in sorted(subset_evals().items()):
        backend = BACKENDS[backend_name]()
        try:
            res = run_file(TESTDATA / "testdata" / file, backend, lines)
        finally:
            backend.close()
        passed = sum(1 for r in res.values() if r is None)
        total_pass += passed
        total += len(lines)
        print(f"{file:28} {passed:4}/{len(lines):<4}")
        if "-v" in argv:
            for line, reason in sorted(res.items()):
                if reason is not None:
                    mark = "gap" if (file, line) in gaps else "NEW"
                    print(f"    {mark} {file}:{line}  {reason}")
    print(f"{'total':28} {total_pass:4}/{total:<4}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main(sys.argv))
