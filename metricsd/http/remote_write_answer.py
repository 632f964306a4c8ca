"""What remote write answers when it did not store every sample of a request.

The samples that could be stored are stored; the answer is then not 204 but 400, naming how many
were refused and why, as Prometheus' receiver answers a too-old, out-of-order or out-of-bounds
(too far in the future) sample (storage/remote/write_handler.go: "a bad request to prevent
retries"): a sender that resent the request would be refused again, and one told 204 would believe
samples stored that are not. Remote write 2.0 answers carry the
``X-Prometheus-Remote-Write-Samples-Written`` header all the same, so the sender knows how many of
its samples did get in. A sample the store already held (a resend: ``rejected_duplicate``) counts
as stored.

Refusals are counted per sender (metricsd/rpc/refusals.py): the request's authenticated name
where there is one, else the client address.
"""

from __future__ import annotations

import json

from metricsd.http.params import ApiError, error_body
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.refusals import SenderRefusals, refused_counts

__all__ = ["SamplesRefused", "refused_answer", "refused_body"]


class SamplesRefused(ApiError):
    """A 400 for a request whose valid samples were stored but some were refused; ``answer`` is the
    backend's WriteResponse, ``written`` the samples stored (or already held)."""

    def __init__(self, answer: pb.WriteResponse, samples: int) -> None:
        self.answer = answer
        self.written = int(answer.samples_written + answer.rejected_duplicate)
        refused = sum(refused_counts(answer).values())
        why = answer.refused or "samples refused"
        super().__init__("bad_data", f"{refused} of {samples} samples not stored, {self.written} stored; {why}", 400)


def refused_answer(answer: pb.WriteResponse, samples: int) -> SamplesRefused | None:
    """The 400 to answer for ``answer`` (a write of ``samples`` samples), or None when every sample
    was stored."""
    return SamplesRefused(answer, samples) if refused_counts(answer) else None


def refused_body(e: SamplesRefused, senders: SenderRefusals, metrics: SelfMetrics, sender: str) -> bytes:
    """The 400's JSON body, after counting the refusal against ``sender`` (the request's
    authenticated name, else its client address) in the log and /metrics."""
    name, counts = senders.record(sender, e.answer)
    for reason, n in counts.items():
        metrics.refused_by_sender.labels(sender=name, reason=reason).inc(n)
    return json.dumps(error_body(e.error_type, e.message)).encode()
