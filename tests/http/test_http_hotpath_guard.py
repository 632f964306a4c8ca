"""A guard for the HTTP hot path (metricsd/http/hotpath.py): it answers /api/v1/query,
/api/v1/query_range and /api/v1/write (metricsd/http/hotwrite.py) below aiohttp's web layer,
repeating the steps of build_app's middlewares (timeouts, errors, gzip, metrics, tokens, a proxy's
whole query) through the functions they share. A middleware or response signal added to build_app
later would silently not apply to those routes; these tests fail when the app's request pipeline
changes, so that whoever changes it mirrors the step in HotRoute (hotroute.py) or its routes (or makes the hot
path hand such requests to aiohttp) and then lists it here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from metricsd.clock import SystemClock
from metricsd.http import HttpSettings
from metricsd.http.hotpath import HotQueries
from metricsd.http.server import HOT_KEY, build_app
from metricsd.security.auth import Authenticator
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

# Every middleware build_app can install, by qualified name, and where the hot path mirrors it.
# A proxy's whole query of consistency one without tokens is begun without a task
# (metricsd/http/hotnow.py NowQueries.take) and answered from the store's answer by NowRequest.done:
# consistency_of, HotRoute.failed (error_of), HotRoute.counted (RequestMetrics), HotProtocol.reply
# (gzip); anything else on the way continues in HotRoute.answer's task, its timeout from when the
# request began.
MIRRORED = {
    "_middleware.<locals>.handle": "HotRoute.answer (metricsd/http/hotroute.py, both routes): consistency, "
                                   "timeout, error_of, RequestMetrics; HotProtocol: gzip; hotnow.NowRequest",
    "auth_middleware.<locals>.check": "HotRoute.identity: metricsd.http.auth.refusal (hotnow: tokens take a task)",
    "whole_query_middleware.<locals>.handle": "HotQueries.run: metricsd.http.wholehttp.WholeHttp.answer; "
                                              "hotnow.NowQueries.take: WholeHttp.ask, WholeHttp.body",
}
WHERE = ("build_app's request pipeline changed: metricsd/http/hotpath.py HotQueries answers /api/v1/query "
         "and /api/v1/query_range WITHOUT aiohttp's middlewares and signals; mirror the new step there (or "
         "hand such requests to aiohttp in parse_request) and list it in MIRRORED")


@dataclass
class _Whole:
    """The one attribute build_app reads of a proxy's whole-query path (metricsd/proxy/wholequery.py)
    to decide whether to install its middleware; nothing here is called while the app is built."""

    enabled: bool = True


class _ProxyLike(LocalBackend):
    """A local backend that also offers whole queries, as a proxy's backend does, so that build_app
    installs every middleware it can."""

    def __init__(self) -> None:
        super().__init__(StoreAPI(Store()))
        self.whole_queries = _Whole()


def _names(tmp_path: Path, *, auth: bool, whole: bool) -> list[str]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\n")
    backend = _ProxyLike() if whole else LocalBackend(StoreAPI(Store()))
    app = build_app(backend, settings=HttpSettings(), registry=CollectorRegistry(), clock=SystemClock(),
                    auth=Authenticator(TokenFile(tokens)) if auth else None)
    assert isinstance(app[HOT_KEY], HotQueries)  # the hot path is on by default
    return [getattr(m, "__qualname__", repr(m)) for m in app.middlewares]


def test_every_middleware_build_app_installs_is_one_the_hot_path_mirrors(tmp_path: Path) -> None:
    everything = _names(tmp_path, auth=True, whole=True)
    assert set(everything) == set(MIRRORED), WHERE
    assert len(everything) == len(MIRRORED), WHERE
    # the order the hot path mirrors: errors and metrics outermost, then tokens, then the whole query
    assert everything == list(MIRRORED), WHERE
    assert _names(tmp_path, auth=False, whole=False) == ["_middleware.<locals>.handle"], WHERE


def test_no_response_signal_the_hot_path_would_skip(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\n")
    app = build_app(_ProxyLike(), settings=HttpSettings(), registry=CollectorRegistry(), clock=SystemClock(),
                    auth=Authenticator(TokenFile(tokens)))
    assert len(app.on_response_prepare) == 0, WHERE
