"""JSON response bodies encoded with orjson (Rust): a Prometheus API answer is a tree of small
dicts, lists and strings, which the standard library's encoder walks in Python.

The output decodes to the same value as the standard encoder's (not the same bytes: no spaces
after separators, UTF-8 instead of escapes of non-ASCII characters); floats are written in the same shortest
round-trip form. What orjson refuses (an int beyond 64 bits, a non-str key, another type) falls
back to the standard encoder. One difference stays: orjson writes a NaN or infinite float as
``null`` where json writes ``NaN``, which is not JSON either. Use it for bodies without such
floats: the Prometheus API's sample values are strings ("NaN", "+Inf") by its format.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

__all__ = ["dumps", "json_response"]


def dumps(data: Any) -> bytes:
    """``data`` as JSON in UTF-8 bytes (see the module for the one difference from ``json.dumps``)."""
    try:
        return orjson.dumps(data, option=orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME,
                            default=_refuse)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(data).encode()


def _refuse(obj: Any) -> Any:
    raise TypeError(type(obj).__name__)


def json_response(data: Any, status: int = 200) -> web.Response:
    """``aiohttp.web.json_response(data, status=status)``, encoded by :func:`dumps`."""
    return web.Response(body=dumps(data), status=status, content_type="application/json", charset="utf-8")
