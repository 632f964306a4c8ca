"""Clusters missing from an answer, carried from a federating backend to whoever serves the answer.

A federating proxy (metricsd/federation/) puts the clusters that did not answer in each reply's
``missing_clusters`` field, which the gRPC API sends as is. The HTTP API builds one answer from
several backend calls (a PromQL query may read several selectors), deep inside code that only
sees results; rather than thread a list through every layer, the backend also :func:`report`\\ s
them into the collector the HTTP request opened with :func:`collecting`, and the HTTP layer turns
what was collected into Prometheus ``warnings``. The collector is a context variable: tasks that
``asyncio.gather`` starts for the request copy the context and so share the request's list, and
requests never see each other's.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass

from metricsd.proto import metricsd_pb2 as pb

__all__ = ["Missing", "collecting", "from_pb", "report", "to_pb", "warning"]


@dataclass(frozen=True, order=True)
class Missing:
    cluster: str
    reason: str  # "did not answer within 2 s: <error>"


_collector: ContextVar[list[Missing] | None] = ContextVar("metricsd_missing_clusters", default=None)


class collecting:  # lower case: used as the function it was
    """Collect what backends report while the block runs (in this task and the tasks it starts).
    A class, not a ``@contextmanager`` generator: entered once per HTTP request (perf/RESULTS.md,
    session 40, s40-23c)."""

    __slots__ = ("found", "token")

    def __init__(self) -> None:
        self.found: list[Missing] = []
        self.token: Token[list[Missing] | None] | None = None

    def __enter__(self) -> list[Missing]:
        self.token = _collector.set(self.found)
        return self.found

    def __exit__(self, *_: object) -> None:
        if self.token is not None:
            _collector.reset(self.token)
            self.token = None


def report(missing: Iterable[Missing]) -> None:
    """Add to the current collector; nothing happens outside :func:`collecting`."""
    found = _collector.get()
    if found is not None:
        for m in missing:
            if m not in found:
                found.append(m)


def warning(m: Missing) -> str:
    """The Prometheus API's warning text for a missing cluster."""
    return f"cluster {m.cluster} {m.reason}"


def to_pb(missing: Iterable[Missing]) -> list[pb.MissingCluster]:
    return [pb.MissingCluster(cluster=m.cluster, reason=m.reason) for m in missing]


def from_pb(missing: Iterable[pb.MissingCluster]) -> list[Missing]:
    return [Missing(m.cluster, m.reason) for m in missing]
