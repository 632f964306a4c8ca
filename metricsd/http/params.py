"""Request parameters in Prometheus' formats, and the API's error type.

Times are Unix seconds (fractions allowed) or RFC 3339; durations are seconds or a Prometheus
duration (``5m``); selectors are PromQL series selectors. Every parse error names the parameter,
in the words Prometheus' own API uses, so clients that match on messages keep working.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

import promql_parser as pp
from aiohttp import web
from multidict import MultiDict, MultiMapping

from metricsd.promql.selectors import td_ms, to_matchers
from metricsd.promql.values import PromQLError
from metricsd.selector import Matcher

__all__ = ["ApiError", "Params", "error_body", "query_timeout_s", "range_ms", "read_params"]

# Status per Prometheus errorType (web/api/v1/api.go returnAPIError).
STATUS_OF = {"bad_data": 400, "execution": 422, "unavailable": 503, "timeout": 503, "internal": 500,
             "not_found": 404, "too_large": 413, "canceled": 499}


class ApiError(Exception):
    """An error answered as ``{"status": "error", "errorType": ..., "error": ...}``."""

    def __init__(self, error_type: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status if status is not None else STATUS_OF.get(error_type, 500)


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"status": "error", "errorType": error_type, "error": message}


def bad(param: str, message: str) -> ApiError:
    return ApiError("bad_data", f'invalid parameter "{param}": {message}')


class Params:
    """Query-string and form parameters together, as Prometheus reads GET and POST alike."""

    def __init__(self, values: MultiMapping[str]) -> None:
        self.values = values

    def get(self, name: str) -> str | None:
        v = self.values.get(name)
        return None if v is None else str(v)

    def getall(self, name: str) -> list[str]:
        return [str(v) for v in self.values.getall(name, [])]

    def require(self, name: str) -> str:
        v = self.get(name)
        if v is None or v == "":
            raise bad(name, "parameter is missing")
        return v

    def time_ms(self, name: str, default: int) -> int:
        v = self.get(name)
        return default if v is None or v == "" else parse_time_ms(v, name)

    def duration_ms(self, name: str, default: int | None = None) -> int:
        v = self.get(name)
        if v is None or v == "":
            if default is None:
                raise bad(name, "parameter is missing")
            return default
        return parse_duration_ms(v, name)

    def matchers(self, name: str = "match[]") -> list[list[Matcher]]:
        return [parse_series_selector(s, name) for s in self.getall(name)]


async def read_params(request: web.Request) -> Params:
    """The query string's parameters, and a POST form's after them (Prometheus reads both)."""
    if request.method != "POST":  # the query string alone: read as it is, not copied
        return Params(request.query)
    merged: MultiDict[str] = MultiDict(request.query)
    if request.content_type == "application/x-www-form-urlencoded":
        form = await request.post()
        for k, v in form.items():
            if isinstance(v, str):
                merged.add(k, v)
    return Params(merged)


def parse_time_ms(text: str, param: str = "time") -> int:
    try:
        secs = float(text)
        if math.isfinite(secs):
            return round(secs * 1000)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if t.tzinfo is not None:
            return round(t.timestamp() * 1000)
    except ValueError:
        pass
    raise bad(param, f'cannot parse "{text}" to a valid timestamp')


def parse_duration_ms(text: str, param: str) -> int:
    try:
        secs = float(text)
        if math.isfinite(secs):
            return round(secs * 1000)
        raise bad(param, f'cannot parse "{text}" to a valid duration. It overflows int64')
    except ValueError:
        pass
    try:
        return td_ms(pp.parse_duration(text))
    except BaseException as e:  # the parser's binding may raise a PanicException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        raise bad(param, f'cannot parse "{text}" to a valid duration') from None


def parse_series_selector(text: str, param: str = "match[]") -> list[Matcher]:
    """A PromQL series selector (``up{job="x"}``, ``{__name__=~"a.*"}``) into matchers."""
    try:
        node: Any = pp.parse(text)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        raise bad(param, f"{e}") from None
    if type(node).__name__ != "VectorSelector" or node.offset is not None or node.at is not None:
        raise bad(param, f"{text!r} is not a series selector")
    try:
        matchers = to_matchers(node)
    except PromQLError as e:
        raise bad(param, e.message) from None
    if all(m.matches("") for m in matchers):
        raise bad(param, "match[] must contain at least one non-empty matcher")
    return matchers


def positive_int(params: Params | Mapping[str, str], name: str, default: int) -> int:
    v = params.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise bad(name, f'cannot parse "{v}" as an integer') from None
    if n < 0:
        raise bad(name, "must not be negative")
    return n


def query_timeout_s(params: Params, limit_s: float) -> float:
    """A query's time limit: the server's ``limit_s``, or the request's ``timeout`` when shorter.
    Raises ApiError (400) for a bad or non-positive ``timeout``."""
    if params.get("timeout"):
        limit_s = min(limit_s, params.duration_ms("timeout") / 1000.0)
    if limit_s <= 0:
        raise bad("timeout", "must be positive")
    return limit_s


def range_ms(params: Params) -> tuple[int, int, int]:
    """A range query's (start, end, step) in ms, read in the order Prometheus reads them (both
    times parsed before a missing one is named), so a bad request gets Prometheus' 400."""
    start = params.time_ms("start", -1) if params.get("start") else None
    end = params.time_ms("end", -1) if params.get("end") else None
    if start is None:
        raise bad("start", "parameter is missing")
    if end is None:
        raise bad("end", "parameter is missing")
    return start, end, params.duration_ms("step")
