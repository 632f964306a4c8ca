"""The Kubernetes aggregated API server: ``metrics.k8s.io/v1beta1`` (what metrics-server serves,
for ``kubectl top`` and the stock HPA's Resource metrics), ``custom.metrics.k8s.io/v1beta2`` and
``external.metrics.k8s.io/v1beta1`` (what prometheus-adapter serves, from rules of its format).

Every value is a pushed-down aggregate asked of a store or proxy over gRPC; no raw samples are
read. Pure modules turn aggregates into API objects (``quantity``, ``discovery``, ``resource``,
``rules``, ``custom``, ``labelselector``) and check the front proxy's identity (``requestheader``);
``server`` is the thin aiohttp shell around them.
"""
