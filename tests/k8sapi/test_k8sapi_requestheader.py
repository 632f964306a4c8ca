"""The front proxy's identity: believed only from a verified certificate with an allowed name."""

from __future__ import annotations

import json

import pytest

from metricsd.k8sapi.requestheader import RequestHeaderSettings, front_proxy_user, settings_from_configmap

FRONT = {"subject": ((("countryName", "XX"),), (("commonName", "front-proxy-client"),))}
HEADERS = [("X-Remote-User", "alice"), ("X-Remote-Group", "devs"), ("x-remote-group", "system:authenticated"),
           ("X-Remote-Extra-Scopes", "a"), ("X-Remote-Extra-Scopes", "b"), ("Accept", "application/json")]


def test_a_verified_front_proxy_names_the_user_groups_and_extras() -> None:
    user = front_proxy_user(RequestHeaderSettings(frozenset({"front-proxy-client"})), FRONT, HEADERS)
    assert user is not None
    assert (user.name, user.groups, dict(user.extra), user.proxy) == (
        "alice", ("devs", "system:authenticated"), {"scopes": ("a", "b")}, "front-proxy-client")


@pytest.mark.parametrize("peercert", [None, {}], ids=["no TLS", "no client certificate"])
def test_headers_without_a_certificate_are_ignored(peercert: dict[str, object] | None) -> None:
    assert front_proxy_user(RequestHeaderSettings(), peercert, HEADERS) is None


def test_a_common_name_not_allowed_is_ignored_and_any_is_allowed_without_a_list() -> None:
    other = {"subject": ((("commonName", "kubelet"),),)}
    assert front_proxy_user(RequestHeaderSettings(frozenset({"front-proxy-client"})), other, HEADERS) is None
    assert front_proxy_user(RequestHeaderSettings(), other, HEADERS) is not None


def test_no_user_header_is_no_user() -> None:
    assert front_proxy_user(RequestHeaderSettings(), FRONT, [("X-Remote-Group", "devs")]) is None


def test_custom_header_names() -> None:
    s = RequestHeaderSettings(username_headers=("X-User",), group_headers=("X-Groups",))
    user = front_proxy_user(s, FRONT, [("X-Remote-User", "mallory"), ("X-User", "bob"), ("X-Groups", "g")])
    assert user is not None and (user.name, user.groups) == ("bob", ("g",))


def test_the_configmap_of_the_api_server() -> None:
    ca, s = settings_from_configmap({
        "requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\n...",
        "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
        "requestheader-username-headers": json.dumps(["X-Remote-User"]),
        "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
    })
    assert ca is not None and ca.startswith("-----BEGIN")
    assert s == RequestHeaderSettings(frozenset({"front-proxy-client"}))
    with pytest.raises(ValueError, match="requestheader-allowed-names is not a JSON array"):
        settings_from_configmap({"requestheader-allowed-names": "front-proxy-client"})
