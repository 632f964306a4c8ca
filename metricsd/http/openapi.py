"""The OpenAPI 3.1 document of the HTTP API, served at ``/api/v1/metricsd/openapi.json``.

Kept next to the handlers and checked against their real responses by a test, so the two cannot
drift apart. Schemas are JSON Schema 2020-12 (OpenAPI 3.1): ``"type": ["number", "null"]`` for a
value that may be missing.
"""

from __future__ import annotations

from typing import Any

from metricsd import __version__

__all__ = ["openapi_document"]

_NUM_OR_NULL = {"type": ["number", "null"]}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}


def _ok(data_ref: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["status", "data"],
        "properties": {
            "status": {"const": "success"}, "data": {"$ref": f"#/components/schemas/{data_ref}"},
            # from a federating proxy (metricsd federate) when some clusters did not answer
            "warnings": {"type": "array", "items": {"type": "string"}},
            "missingClusters": {"type": "array", "items": {
                "type": "object", "required": ["cluster", "reason"],
                "properties": {"cluster": {"type": "string"}, "reason": {"type": "string"}}}},
        },
    }


def _param(name: str, desc: str, required: bool = False, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """A query parameter; a required string must not be empty (the handlers refuse an empty one)."""
    return {"name": name, "in": "query", "required": required, "description": desc,
            "schema": schema or ({"type": "string", "minLength": 1} if required else {"type": "string"})}


def _responses(ok_schema: str, *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": "success", "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{ok_schema}"}}}}}
    for code in errors or (400, 503):
        out[str(code)] = {"description": "error", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"}}}}
    return out


_AGG_PARAMS = [
    _param("metric", "Metric name, e.g. container_cpu_usage_seconds_total.", True),
    _param("selector", 'Label matchers, e.g. workload="web",namespace=~"prod-.*".'),
    _param("fn", "Per-series function over the window.",
           schema={"enum": ["avg", "min", "max", "last", "sum", "count", "rate", "increase"], "default": "rate"}),
    _param("window", "Per-series window (seconds or a duration such as 1m).", schema={"default": "1m",
                                                                                      "type": "string"}),
    _param("across", "Across-series function per group.",
           schema={"enum": ["avg", "sum", "min", "max", "count", "quantile"], "default": "avg"}),
    _param("quantile", "For across=quantile, in [0, 1].", schema={"type": "number", "default": 0.9}),
    _param("by", "Comma-separated label names to group by."),
    _param("ratio_metric", "Divide by this metric, aggregated the same way over the same matchers."),
    _param("ratio_selector", "Extra matchers for the ratio's metric."),
    _param("ratio_fn", "Per-series function of the ratio's metric.", schema={"type": "string", "default": "last"}),
    _param("ratio_window", "Window of the ratio's metric.", schema={"type": "string", "default": "5m"}),
    _param("time", "Evaluation time (Unix seconds or RFC 3339); default now."),
    _param("start", "Range start; with end and step makes a range query."),
    _param("end", "Range end."),
    _param("step", "Range step.", schema={"type": "string", "default": "1m"}),
]

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["status", "errorType", "error"],
        "properties": {"status": {"const": "error"}, "errorType": {"type": "string"}, "error": {"type": "string"}},
    },
    "AggregateData": {
        "type": "object",
        "required": ["timestamps", "groups", "seriesScanned", "samplesScanned"],
        "additionalProperties": False,
        "properties": {
            "timestamps": {"type": "array", "items": {"type": "integer"}, "description": "ms since the epoch"},
            "groups": {"type": "array", "items": {
                "type": "object", "required": ["labels", "values"], "additionalProperties": False,
                "properties": {"labels": _LABELS, "values": {"type": "array", "items": _NUM_OR_NULL}},
            }},
            "seriesScanned": {"type": "integer"},
            "samplesScanned": {"type": "integer"},
        },
    },
    "Resource": {
        "type": "object", "required": ["usage", "request", "limit"], "additionalProperties": False,
        "properties": {"usage": _NUM_OR_NULL, "request": _NUM_OR_NULL, "limit": _NUM_OR_NULL},
    },
    "PodsData": {
        "type": "object",
        "required": ["namespace", "workload", "time", "pods"],
        "additionalProperties": False,
        "properties": {
            "namespace": {"type": "string"}, "workload": {"type": "string"}, "time": {"type": "integer"},
            "pods": {"type": "array", "items": {
                "type": "object", "required": ["namespace", "pod", "node", "cpu", "memory"],
                "additionalProperties": False,
                "properties": {
                    "namespace": {"type": "string"}, "pod": {"type": "string"}, "node": {"type": "string"},
                    "cpu": {"$ref": "#/components/schemas/Resource", "description": "cores"},
                    "memory": {"$ref": "#/components/schemas/Resource", "description": "bytes"},
                },
            }},
        },
    },
    "SeriesList": {"type": "array", "items": {
        "type": "object", "required": ["id", "labels"], "additionalProperties": False,
        "properties": {"id": {"type": "string", "pattern": "^[0-9a-f]{16}$"}, "labels": _LABELS},
    }},
    "StatsData": {
        "type": "object",
        "required": ["series", "samples", "pods", "chunkBytes", "chunkSamples", "bytesPerSample", "headSamples",
                     "rollupBuckets", "rejected", "health"],
        "additionalProperties": False,
        "properties": {
            **{k: {"type": "integer"} for k in ("series", "samples", "pods", "chunkBytes", "chunkSamples",
                                                "headSamples", "rollupBuckets")},
            "bytesPerSample": {"type": "number"},
            "rejected": {"type": "object", "additionalProperties": {"type": "integer"}},
            "health": {"type": "object", "required": ["status", "member", "version"], "properties": {
                "status": {"enum": ["UNKNOWN", "SERVING", "CATCHING_UP", "NOT_SERVING"]},
                "member": {"type": "string"}, "version": {"type": "string"}}},
        },
    },
    "PromQueryData": {
        "type": "object", "required": ["resultType", "result"],
        "properties": {"resultType": {"enum": ["vector", "matrix", "scalar", "string"]},
                       "result": {"type": "array"}},
    },
    "AggregateResponse": _ok("AggregateData"),
    "PodsResponse": _ok("PodsData"),
    "SeriesResponse": _ok("SeriesList"),
    "StatsResponse": _ok("StatsData"),
    "PromQueryResponse": _ok("PromQueryData"),
}


def openapi_document() -> dict[str, Any]:
    agg = {"summary": "An aggregate pushed down into the stores (the gRPC Aggregate question).",
           "parameters": _AGG_PARAMS, "responses": _responses("AggregateResponse", 400, 503)}
    prom_query = {"summary": "Prometheus instant query.", "parameters": [
        _param("query", "PromQL expression.", True), _param("time", "Evaluation time."),
        _param("timeout", "Evaluation timeout.")], "responses": _responses("PromQueryResponse", 400, 422, 503)}
    prom_range = {"summary": "Prometheus range query.", "parameters": [
        _param("query", "PromQL expression.", True), _param("start", "Start time.", True),
        _param("end", "End time.", True), _param("step", "Step (seconds or a duration).", True),
        _param("timeout", "Evaluation timeout.")], "responses": _responses("PromQueryResponse", 400, 422, 503)}
    return {
        "openapi": "3.1.0",
        "info": {"title": "metricsd HTTP API", "version": __version__,
                 "description": "Native JSON endpoints of metricsd, and the Prometheus-compatible query API."},
        "paths": {
            "/api/v1/metricsd/aggregate": {"get": agg, "post": agg},
            "/api/v1/metricsd/pods": {"get": {
                "summary": "Pods of a workload with their latest usage, requests and limits, busiest CPU first.",
                "parameters": [_param("namespace", "Namespace.", True), _param("workload", "Workload.", True),
                               _param("time", "Evaluation time; default now."),
                               _param("window", "CPU rate window.", schema={"type": "string", "default": "2m"})],
                "responses": _responses("PodsResponse", 400, 503)}},
            "/api/v1/metricsd/series": {"get": {
                "summary": "Series matching PromQL series selectors.",
                "parameters": [_param("match[]", "Series selector, repeatable.", True),
                               _param("limit", "At most this many.", schema={"type": "integer"})],
                "responses": _responses("SeriesResponse", 400, 503)}},
            "/api/v1/metricsd/stats": {"get": {"summary": "What the store holds, and its health.",
                                               "responses": _responses("StatsResponse", 503)}},
            "/api/v1/query": {"get": prom_query, "post": prom_query},
            "/api/v1/query_range": {"get": prom_range, "post": prom_range},
            "/api/v1/write": {"post": {
                "summary": "Prometheus remote write 1.0 (snappy block-compressed prometheus.WriteRequest).",
                "requestBody": {"required": True, "content": {"application/x-protobuf": {
                    "schema": {"type": "string", "format": "binary"}}}},
                "responses": {"204": {"description": "stored"}, **{k: v for k, v in _responses(
                    "Error", 400, 413, 503).items() if k != "200"}}}},
        },
        "components": {"schemas": _SCHEMAS},
    }
