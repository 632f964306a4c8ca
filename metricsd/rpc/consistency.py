"""How many replicas a read asks: a per-request choice, as Cassandra and Mimir offer it.

``QUORUM`` (the default everywhere but the PromQL HTTP API): R replies per slot out of RF, so a
read overlaps the last acknowledged write (R + W > RF) and sees every acknowledged sample; replies
are compared by digest and laggards repaired. The autoscalers' questions (gRPC Aggregate, the
consumers, ``metricsd k8s-api``) read so.

``ONE``: one replica per slot, hedged to the next when the first is slow (metricsd/proxy/hedge.py).
A dashboard's read: half the work of a quorum read, but it may miss a sample that only some
replicas hold yet (one acknowledged by W replicas while the replica asked was not among them, until
hinted hand-off, read repair or catch-up brings it there).

The choice travels with the request's context (a :class:`contextvars.ContextVar`), so the HTTP
layer sets it once per request and every read the request makes, through the PromQL engine or the
pushdown, sees it without each signature carrying it; tasks the request starts inherit it. A
backend that holds one copy (one store) ignores it.
"""

from __future__ import annotations

import enum
from contextvars import ContextVar, Token

__all__ = ["CONSISTENCY_HEADER", "CONSISTENCY_PARAM", "Consistency", "current", "parse", "reading_with"]

CONSISTENCY_PARAM = "consistency"  # ?consistency=quorum on the HTTP API
CONSISTENCY_HEADER = "X-Metricsd-Consistency"


class Consistency(enum.Enum):
    ONE = "one"
    QUORUM = "quorum"


_CURRENT: ContextVar[Consistency] = ContextVar("metricsd_read_consistency", default=Consistency.QUORUM)


def current() -> Consistency:
    """The consistency of the read being made (QUORUM unless a caller chose otherwise)."""
    return _CURRENT.get()


class reading_with:  # lower case: used as the function it was
    """Reads made inside (and by tasks started inside) use ``level``. A class, not a
    ``@contextmanager`` generator: entered once per HTTP request, and the generator's machinery was
    ~9 Python calls of the proxy's ~440 a query (perf/RESULTS.md, session 40, s40-23c)."""

    __slots__ = ("level", "token")

    def __init__(self, level: Consistency) -> None:
        self.level = level
        self.token: Token[Consistency] | None = None

    def __enter__(self) -> None:
        self.token = _CURRENT.set(self.level)

    def __exit__(self, *_: object) -> None:
        if self.token is not None:
            _CURRENT.reset(self.token)
            self.token = None


def parse(text: str) -> Consistency:
    """``one`` or ``quorum`` (any case); raises ValueError naming the accepted values."""
    try:
        return Consistency(text.strip().lower())
    except ValueError:
        raise ValueError(f"unknown read consistency {text!r}: use one or quorum") from None
