"""Prometheus' own PromQL test scripts, every in-subset eval, against each backend.

A file's test fails if an eval fails that is not in known_gaps.txt, or if a listed eval passes
(so the list only ever shrinks honestly).
"""

from __future__ import annotations

import pytest
from promql_script_backend import BACKENDS
from promql_script_runner import TESTDATA, known_gaps, run_file, subset_evals

_INDEX = TESTDATA / "evals_index.tsv"
_SUBSET = subset_evals() if _INDEX.exists() else {}


@pytest.fixture(params=sorted(BACKENDS))
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_subset_is_what_the_index_says() -> None:
    if not _SUBSET:
        pytest.skip(f"no PromQL test data at {TESTDATA}")
    assert sum(len(v) for v in _SUBSET.values()) == 535


def test_known_gaps_are_in_the_subset() -> None:
    if not _SUBSET:
        pytest.skip(f"no PromQL test data at {TESTDATA}")
    for file, line in known_gaps():
        assert line in _SUBSET.get(file, set()), f"{file}:{line} is not an in-subset eval"


@pytest.mark.parametrize("file", sorted(_SUBSET) or ["<no test data>"])
def test_script(file: str, backend_name: str) -> None:
    if not _SUBSET:
        pytest.skip(f"no PromQL test data at {TESTDATA}")
    gaps = {line: why for (f, line), why in known_gaps(backend=backend_name).items() if f == file}
    backend = BACKENDS[backend_name]()
    try:
        results = run_file(TESTDATA / "testdata" / file, backend, _SUBSET[file])
    finally:
        backend.close()
    assert set(results) == _SUBSET[file], "some in-subset evals were not found in the script"
    unexpected = [f"{file}:{line}  {why}" for line, why in sorted(results.items()) if why and line not in gaps]
    fixed = [f"{file}:{line}" for line in sorted(gaps) if results.get(line) is None]
    assert not unexpected, "failing evals not in known_gaps.txt:\n" + "\n".join(unexpected)
    assert not fixed, "evals in known_gaps.txt now pass; remove them:\n" + "\n".join(fixed)
