"""Who a request comes from, as an aggregated API server must tell it.

The API server's aggregator authenticates and authorises the user (RBAC on ``pods.metrics.k8s.io``
and the other resources), then proxies the request over TLS presenting its front-proxy client
certificate (``--proxy-client-cert-file``) and names the user in ``X-Remote-User``,
``X-Remote-Group`` and ``X-Remote-Extra-*`` headers. Those headers are believed only on a
connection whose client certificate chains to the request-header CA
(``--requestheader-client-ca-file``, the ``requestheader-client-ca-file`` key of the
``kube-system/extension-apiserver-authentication`` ConfigMap) and, when allowed names are set
(``--requestheader-allowed-names``), whose common name is one of them. The TLS handshake checks the
chain (the listener asks for a client certificate, optionally, trusting only that CA); this module
checks the rest. From any other connection the headers are ignored, never trusted.

A request without the front proxy's certificate may still carry a bearer token (``--tokens-file``,
``--tokenreview``), checked by metricsd's own Authenticator for the ``read`` role; anything else
is 401. Health probes and discovery documents are open (they carry no metric values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FrontProxyUser", "RequestHeaderSettings", "common_name", "front_proxy_user",
           "settings_from_configmap"]


@dataclass(frozen=True)
class RequestHeaderSettings:
    allowed_names: frozenset[str] = frozenset()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)


@dataclass(frozen=True)
class FrontProxyUser:
    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    proxy: str = ""  # the front proxy certificate's common name


def common_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The subject CN of a certificate as ``ssl.SSLSocket.getpeercert()`` returns it (a verified
    one: the dict is empty when no certificate was presented)."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def front_proxy_user(settings: RequestHeaderSettings, peercert: Mapping[str, Any] | None,
                     headers: Sequence[tuple[str, str]]) -> FrontProxyUser | None:
    """The user the front proxy names, or None when the connection is not the front proxy's (no
    verified certificate, or a common name not allowed) or it names no user. ``headers`` are the
    request's (name, value) pairs, repeated names kept, as Kubernetes reads them."""
    cn = common_name(peercert)
    if cn is None or (settings.allowed_names and cn not in settings.allowed_names):
        return None
    lower = [(k.lower(), v) for k, v in headers]

    def values(name: str) -> list[str]:
        return [v for k, v in lower if k == name.lower()]

    user = next((v for h in settings.username_headers for v in values(h) if v), None)
    if user is None:
        return None
    groups = tuple(v for h in settings.group_headers for v in values(h))
    extra: dict[str, list[str]] = {}
    for prefix in settings.extra_prefixes:
        p = prefix.lower()
        for k, v in lower:
            if k.startswith(p) and len(k) > len(p):
                extra.setdefault(k[len(p):], []).append(v)
    return FrontProxyUser(user, groups, {k: tuple(v) for k, v in extra.items()}, cn)


def settings_from_configmap(data: Mapping[str, str]) -> tuple[str | None, RequestHeaderSettings]:
    """The request-header CA (PEM) and settings from the ``extension-apiserver-authentication``
    ConfigMap's data, whose list values are JSON arrays. Raises ValueError naming the key."""
    def array(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        text = data.get(key)
        if text is None:
            return default
        try:
            value = json.loads(text)
        except ValueError as e:
            raise ValueError(f"extension-apiserver-authentication: {key} is not a JSON array: {e}") from e
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"extension-apiserver-authentication: {key} is not a JSON array of strings")
        return tuple(value)

    base = RequestHeaderSettings()
    return data.get("requestheader-client-ca-file"), RequestHeaderSettings(
        frozenset(array("requestheader-allowed-names", ())),
        array("requestheader-username-headers", base.username_headers),
        array("requestheader-group-headers", base.group_headers),
        array("requestheader-extra-headers-prefix", base.extra_prefixes))
