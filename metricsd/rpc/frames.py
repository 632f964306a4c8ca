"""The read port's frames (layout in metricsd/rpc/FORMAT.md): a 16-byte header, then the body.

A proxy's read of a store costs what its message costs: a unary grpc.aio call costs each end
250-500 us of CPU in Python, a frame on an open asyncio connection 20-40 us
(perf/bench_grpc_calls.py, perf/RESULTS.md "Reads at Go speed"). Pure: no I/O.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator

import grpc
from google.protobuf.message import Message

from metricsd.proto import metricsd_pb2 as pb

__all__ = ["HEADER", "MAX_BODY", "METHODS", "FrameError", "Kind", "Method", "decode_header", "encode", "take_frames"]

HEADER = struct.Struct("<IQBBH")  # body length, request id, kind, method or status code, reserved
MAX_BODY = 64 * 1024 * 1024  # as gRPC's message limit (rpc/server.py GRPC_OPTIONS)


class Kind(enum.IntEnum):
    HELLO = 1  # client -> server, first frame of a connection: the bearer token (may be empty)
    REQUEST = 2  # client -> server: a serialized request of the frame's method
    RESPONSE = 3  # server -> client: the serialized response (to HELLO: empty, the token is good)
    ERROR = 4  # server -> client: a gRPC status code in the method byte, the message as UTF-8


class Method(enum.IntEnum):
    READ = 1
    AGGREGATE = 2
    LIST_SERIES = 3
    LABEL_VALUES = 4
    ROLLUPS = 5
    QUERY = 6  # a whole PromQL query (rpc/wholequery.py); not a protobuf method, so not in METHODS
    WRITE_PARTS = 7  # a proxy's WritePartsRequest to a store (rpc/servicer.py write_parts_body); not in METHODS


# method -> (the gRPC method's name, its request and response messages, the MetricsBackend method)
METHODS: dict[int, tuple[str, type[Message], type[Message], str]] = {
    Method.READ: ("Read", pb.ReadRequest, pb.ReadResponse, "read"),
    Method.AGGREGATE: ("Aggregate", pb.AggregateRequest, pb.AggregateResponse, "aggregate"),
    Method.LIST_SERIES: ("ListSeries", pb.ListSeriesRequest, pb.ListSeriesResponse, "list_series"),
    Method.LABEL_VALUES: ("LabelValues", pb.LabelValuesRequest, pb.LabelValuesResponse, "label_values"),
    Method.ROLLUPS: ("Rollups", pb.ReadRequest, pb.RollupsResponse, "rollups"),
}


class FrameError(ValueError):
    """A header that breaks the format (unknown kind, a body over MAX_BODY, a reserved field set):
    the connection cannot be trusted to be in step and is closed."""


def encode(kind: Kind, request_id: int, code: int, body: bytes) -> bytes:
    """One frame. Raises FrameError for a body over MAX_BODY."""
    if len(body) > MAX_BODY:
        raise FrameError(f"a frame body of {len(body)} bytes is over the limit of {MAX_BODY}")
    return HEADER.pack(len(body), request_id, kind, code, 0) + body


def decode_header(header: bytes) -> tuple[int, int, Kind, int]:
    """(body length, request id, kind, method or status code). Raises FrameError."""
    length, request_id, kind, code, reserved = HEADER.unpack(header)
    if reserved != 0:
        raise FrameError(f"reserved header field is {reserved}, not 0 (not a metricsd read port frame?)")
    if length > MAX_BODY:
        raise FrameError(f"a frame body of {length} bytes is over the limit of {MAX_BODY}")
    try:
        return length, request_id, Kind(kind), code
    except ValueError:
        raise FrameError(f"unknown frame kind {kind}") from None


def take_frames(buf: bytearray) -> Iterator[tuple[int, Kind, int, bytes]]:
    """The whole frames at the start of ``buf`` (request id, kind, method or code, body), each
    taken off it as it is yielded; a frame not yet whole stays. Raises FrameError for a header
    out of format (the caller closes the connection)."""
    while len(buf) >= HEADER.size:
        length, request_id, kind, code = decode_header(bytes(buf[:HEADER.size]))
        end = HEADER.size + length
        if len(buf) < end:
            return
        body = bytes(buf[HEADER.size:end])
        del buf[:end]
        yield request_id, kind, code, body


def status_code(value: int) -> grpc.StatusCode:
    """The gRPC status code an ERROR frame carries (UNKNOWN for a value gRPC has not)."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


_CODES = {c.value[0]: c for c in grpc.StatusCode}
