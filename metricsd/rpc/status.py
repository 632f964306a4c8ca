"""gRPC status codes back into the MetricsBackend interface's errors, for every client of the API."""

from __future__ import annotations

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, LimitExceeded, NotOwner, Unavailable

__all__ = ["error_of", "part_error"]

_CODES = {c.value[0]: c for c in grpc.StatusCode}


def error_of(method: str, code: grpc.StatusCode, details: str) -> Exception:
    """The MetricsBackend error a status code stands for."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadRequest(details or "invalid argument")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return LimitExceeded(details or "resource exhausted")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return NotOwner(f"{method}: {details}")
    return Unavailable(f"{method}: {code.name}: {details}")


def part_error(result: pb.WritePartResult) -> Exception | None:
    """The error a WriteParts result stands for (None: the part was written)."""
    if result.code == 0:
        return None
    return error_of("Write", _CODES.get(result.code, grpc.StatusCode.UNKNOWN), result.message)
