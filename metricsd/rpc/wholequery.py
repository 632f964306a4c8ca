"""The body of the read port's QUERY frame: a whole PromQL query a proxy sends to one store, and
the finished answer the store sends back (layout in FORMAT.md, "6 Query"). Pure: no I/O.

Through the cluster, a dashboard's ``rate()`` of one pod cost the proxy its HTTP, the PromQL
engine and a read of every selector from a store, and the store the read: about 2.4x one store's
CPU (perf/RESULTS.md, issue 23). When one store holds every slot a query can touch, the proxy sends
it the query instead, and relays the answer's bytes without parsing them.

The request carries everything the answer depends on besides the data: the query, its times, the
proxy's PromQL settings (lookback, max samples, pushdown, the query limits and timeout), so a
store answers exactly what the proxy would, under the same limits, and with the same errors.
JSON, not protobuf: the proto file stays as it is, and a frame is decoded once per query.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from metricsd.rpc.backend import Unavailable

__all__ = ["ANSWER_DATA", "ANSWER_ERROR", "ANSWER_TIMED", "LIMIT_NAMES", "MAX_FRAME_SLOTS", "NoReadPort",
           "NotSupported", "QueryAnswer", "QueryFrame", "RunnerSettings", "decode_answer", "decode_request",
           "encode_request", "error_answer", "timed_answer"]

ANSWER_DATA = 0  # first byte of an answer: the Prometheus JSON ``data`` member follows
ANSWER_ERROR = 1  # first byte of an answer: a JSON error object follows
# first byte of an answer to a request with "cpu": true: the store's own time for the query follows
# (u64 ns), then an answer as above. Asked for, so that a store never sends it to a proxy that
# predates it; a store that predates it ignores the request's field and answers 0 or 1.
ANSWER_TIMED = 2
_TIMED_HEAD = 9  # the first byte and the u64


class NotSupported(Unavailable):
    """The store does not know the QUERY method (an older store: ERROR 12 UNIMPLEMENTED)."""


class NoReadPort(Unavailable):
    """The proxy has no read port to the store now (not yet learnt from its Health, or given up
    for a while after it failed): that store is passed over for this query, not for a minute as
    a store that does not know the frame is, and not counted as a failure of the store."""


# The most slots a frame may name: a shard map's slot count is set once at `cluster init` (64 by
# default) and nothing useful comes near this; a hostile frame must not make the store build a
# slot list of a trillion entries before its ownership check refuses it.
MAX_FRAME_SLOTS = 1 << 16
LIMIT_NAMES = ("max_length", "max_depth", "max_operators", "max_concurrency", "max_queued", "max_series")


@dataclass(frozen=True)
class RunnerSettings:
    """The proxy's PromQL settings (metricsd/http/settings.py), which the store's runner takes;
    ``limits``: metricsd/promql/limits.py QueryLimits' fields as (name, value), in LIMIT_NAMES' order."""

    lookback_ms: int
    max_samples: int
    pushdown: bool
    timeout_s: float
    limits: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class QueryFrame:
    """One query. ``instant``: at ``start_ms`` (= ``end_ms``, step 1). ``timeout_s``: the request's
    own timeout (``?timeout=``, at most the runner's). ``slots``: None, every slot of
    ``num_slots`` (the store must hold them all); else the only slots the query may read.
    ``cpu``: the answer is to carry the store's own time for the query (ANSWER_TIMED)."""

    query: str
    instant: bool
    start_ms: int
    end_ms: int
    step_ms: int
    timeout_s: float
    num_slots: int
    slots: tuple[int, ...] | None
    settings: RunnerSettings
    cpu: bool = False


@dataclass(frozen=True)
class QueryAnswer:
    """``data``: the JSON of the result's ``data`` member; else an error as the HTTP API answers
    it (``limit``: the query limit that refused it, for the refusal metric; "" for none).
    ``cpu_s``: the store's own time for the query in seconds (ANSWER_TIMED), None when not sent."""

    data: bytes | None = None
    error_type: str = ""
    message: str = ""
    status: int = 0
    limit: str = ""
    cpu_s: float | None = None


def encode_request(frame: QueryFrame) -> bytes:
    doc = {"query": frame.query, "instant": frame.instant, "start_ms": frame.start_ms, "end_ms": frame.end_ms,
           "step_ms": frame.step_ms, "timeout_s": frame.timeout_s, "num_slots": frame.num_slots,
           "slots": None if frame.slots is None else list(frame.slots), "settings": _settings_doc(frame.settings)}
    if frame.cpu:  # only when asked: the request stays byte for byte what an older proxy sends
        doc["cpu"] = True
    return orjson.dumps(doc)


@functools.lru_cache(maxsize=16)
def _settings_doc(settings: RunnerSettings) -> dict[str, Any]:
    """Once per settings (a proxy has one)."""
    doc = asdict(settings)
    doc["limits"] = dict(settings.limits)
    return doc


def decode_request(body: bytes) -> QueryFrame:
    """Raises ValueError naming what is wrong (the store answers it as INVALID_ARGUMENT)."""
    try:
        doc = orjson.loads(body)  # nesting past 1,024 levels is a JSONDecodeError too
    except orjson.JSONDecodeError as e:
        raise ValueError(f"query frame: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("query frame: not a JSON object")
    s = _field(doc, "settings", dict)
    limits_doc = _field(s, "limits", dict)
    try:
        # in the order sent, not sorted: a proxy sends its settings the same way each time, so the
        # cache hits (sorting them was a third of this function); another order is only a miss
        key = (tuple((k, v) for k, v in s.items() if k != "limits"), tuple(limits_doc.items()))
        settings = _settings(key)
    except TypeError:  # an unhashable value: a list or object where a number belongs
        raise ValueError("query frame: settings hold a value of the wrong type") from None
    num_slots = _field(doc, "num_slots", int)
    if not 1 <= num_slots <= MAX_FRAME_SLOTS:
        raise ValueError(f"query frame: num_slots must be 1 to {MAX_FRAME_SLOTS}, not {num_slots}")
    raw_slots = doc.get("slots")
    slots: tuple[int, ...] | None = None
    if raw_slots is not None:
        if not isinstance(raw_slots, list) or not all(type(x) is int and 0 <= x < num_slots for x in raw_slots):
            raise ValueError(f"query frame: slots must be a list of slots below {num_slots}")
        slots = tuple(raw_slots)
    cpu = doc.get("cpu", False)
    if not isinstance(cpu, bool):
        raise ValueError("query frame: 'cpu' must be true or false")
    frame = QueryFrame(_field(doc, "query", str), _field(doc, "instant", bool), _field(doc, "start_ms", int),
                       _field(doc, "end_ms", int), _field(doc, "step_ms", int),
                       float(_field(doc, "timeout_s", (int, float))), num_slots, slots, settings, cpu)
    if frame.timeout_s <= 0 or num_slots < 1:
        raise ValueError("query frame: timeout_s and num_slots must be positive")
    return frame


@functools.lru_cache(maxsize=16)
def _settings(key: tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]]) -> RunnerSettings:
    """The settings of a frame, checked once per distinct settings (a proxy sends the same each time)."""
    s, limits_doc = dict(key[0]), dict(key[1])
    limits = tuple((k, _field(limits_doc, k, int)) for k in LIMIT_NAMES)
    if any(v < 0 for _, v in limits):
        raise ValueError("query frame: limits must not be negative")
    settings = RunnerSettings(_field(s, "lookback_ms", int), _field(s, "max_samples", int),
                              _field(s, "pushdown", bool), float(_field(s, "timeout_s", (int, float))), limits)
    if settings.timeout_s <= 0 or settings.lookback_ms < 0 or settings.max_samples < 1:
        raise ValueError("query frame: settings: timeout_s and max_samples must be positive, lookback_ms >= 0")
    return settings


def _field(doc: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise ValueError(f"query frame: {name!r} is missing or of the wrong type")
    return value


def error_answer(error_type: str, message: str, status: int, limit: str = "") -> bytes:
    return bytes([ANSWER_ERROR]) + orjson.dumps({"errorType": error_type, "error": message, "status": status,
                                                 "limit": limit})


def timed_answer(cpu_ns: int, answer: bytes) -> bytes:
    """``answer`` (a body as above) with the store's own time for the query in front (ANSWER_TIMED)."""
    return bytes([ANSWER_TIMED]) + max(0, min(cpu_ns, (1 << 64) - 1)).to_bytes(8, "little") + answer


def decode_answer(body: bytes) -> QueryAnswer:
    """Raises Unavailable for an answer out of format."""
    if body[:1] == bytes([ANSWER_DATA]):
        return QueryAnswer(data=body[1:])
    if body[:1] == bytes([ANSWER_TIMED]):
        if len(body) <= _TIMED_HEAD or body[_TIMED_HEAD] == ANSWER_TIMED:
            raise Unavailable("query frame: a timed answer out of format")
        cpu_s = int.from_bytes(body[1:_TIMED_HEAD], "little") / 1e9
        if body[_TIMED_HEAD] == ANSWER_DATA:  # one copy of the data, not two
            return QueryAnswer(data=body[_TIMED_HEAD + 1:], cpu_s=cpu_s)
        return dataclasses.replace(decode_answer(body[_TIMED_HEAD:]), cpu_s=cpu_s)
    if body[:1] == bytes([ANSWER_ERROR]):
        try:
            doc = orjson.loads(body[1:])
            return QueryAnswer(None, str(doc["errorType"]), str(doc["error"]), int(doc["status"]),
                               str(doc.get("limit", "")))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise Unavailable(f"query frame: a malformed error answer: {e}") from None
    raise Unavailable("query frame: an answer out of format")
