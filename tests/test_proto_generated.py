"""The generated gRPC code in metricsd/proto/ matches proto/*.proto (run `make proto`)."""

from __future__ import annotations

from pathlib import Path

from metricsd.proto.generate import GENERATED, ROOT, generate


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    generate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / name).read_text()
        committed = (ROOT / "metricsd" / "proto" / name).read_text()
        assert fresh == committed, f"metricsd/proto/{name} is out of date with proto/: run `make proto`"
