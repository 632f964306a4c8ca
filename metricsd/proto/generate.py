"""Generate metricsd/proto/*_pb2*.py from proto/*.proto (`make proto`).

proto/metricsd.proto is metricsd's gRPC API; proto/prometheus_remote.proto and
proto/prometheus_remote_v2.proto hold the messages of Prometheus remote write 1.0 and 2.0 (no
service, so no gRPC stubs). grpcio-tools writes
``import metricsd_pb2``, which only works with the folder on sys.path; the import is rewritten to
the package path so the generated code imports as ``metricsd.proto``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (
    "metricsd_pb2.py",
    "metricsd_pb2.pyi",
    "metricsd_pb2_grpc.py",
    "prometheus_remote_pb2.py",
    "prometheus_remote_pb2.pyi",
    "prometheus_remote_v2_pb2.py",
    "prometheus_remote_v2_pb2.pyi",
)


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc

    rc = protoc.main(["protoc", *args])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def generate(out_dir: Path, proto_dir: Path = ROOT / "proto") -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    _protoc([
        f"-I{proto_dir}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(proto_dir / "metricsd.proto"),
    ])
    for name in ("prometheus_remote.proto", "prometheus_remote_v2.proto"):
        _protoc([f"-I{proto_dir}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", str(proto_dir / name)])
    grpc_file = out_dir / "metricsd_pb2_grpc.py"
    text = grpc_file.read_text()
    text = text.replace(
        "import metricsd_pb2 as metricsd__pb2", "from metricsd.proto import metricsd_pb2 as metricsd__pb2"
    )
    grpc_file.write_text(text)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "metricsd" / "proto")
