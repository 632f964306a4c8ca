"""Remote-write targets: where samples go onward, and how (``--remote-write-url``, ``--remote-write-config``).

A target is what Prometheus calls a ``remote_write`` entry, and the config file takes the same
fields, so an operator's existing entry works as it is (README: Sending data onward):

```yaml
- url: https://vm.example:8428/api/v1/write
  name: vm                      # optional: names the cursor directory and the /metrics label
  protocol: auto                # auto (2.0 when the receiver says it takes it), "1.0" or "2.0"
  write_relabel_configs: [...]  # Prometheus relabel_configs, metricsd/http/relabel.py
  bearer_token_file: /etc/metricsd/vm-token
  basic_auth: {username: metricsd, password_file: /etc/metricsd/vm-password}
  tls_config: {ca_file: ..., cert_file: ..., key_file: ..., server_name: ..., insecure_skip_verify: false}
  remote_timeout: 30s
  queue_config: {shards: 4, max_samples_per_send: 10000, min_backoff: 100ms, max_backoff: 5s,
                 retry_on_http_429: true}
```

Pure: text in, validated targets out; errors name the file, the entry and the field.
"""

from __future__ import annotations

import hashlib
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from metricsd.http.params import parse_duration_ms
from metricsd.http.relabel import RelabelConfigError, Rule, parse_rules

__all__ = ["TargetConfig", "TargetError", "parse_targets", "target_from_url"]

PROTOCOLS = ("auto", "1.0", "2.0")
_FIELDS = {"url", "name", "protocol", "write_relabel_configs", "bearer_token_file", "bearer_token", "basic_auth",
           "tls_config", "remote_timeout", "queue_config"}
_QUEUE = {"shards", "max_samples_per_send", "min_backoff", "max_backoff", "retry_on_http_429"}
_TLS = {"ca_file", "cert_file", "key_file", "server_name", "insecure_skip_verify"}
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class TargetError(ValueError):
    """A target that cannot be used; the message names where."""


@dataclass(frozen=True)
class TargetConfig:
    url: str
    name: str
    protocol: str = "auto"
    relabel: tuple[Rule, ...] = ()
    bearer_token_file: Path | None = None
    bearer_token: str | None = None
    basic_user: str | None = None
    basic_password_file: Path | None = None
    basic_password: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 30.0
    shards: int = 4
    max_samples_per_send: int = 10_000
    min_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    retry_on_429: bool = True

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TargetError(f"remote-write target {self.url!r}: not an http(s) URL")
        if not _NAME.match(self.name):
            raise TargetError(f"remote-write target {self.url}: name {self.name!r}: letters, digits, '_', '.', '-'")
        if self.protocol not in PROTOCOLS:
            raise TargetError(f"remote-write target {self.name}: protocol {self.protocol!r} (one of {PROTOCOLS})")
        if not 1 <= self.shards <= 256 or self.max_samples_per_send < 1:
            raise TargetError(f"remote-write target {self.name}: shards must be 1..256, max_samples_per_send >= 1")
        if not 0 < self.min_backoff_s <= self.max_backoff_s or self.timeout_s <= 0:
            raise TargetError(f"remote-write target {self.name}: needs 0 < min_backoff <= max_backoff, timeout > 0")
        if (self.cert_file is None) != (self.key_file is None):
            raise TargetError(f"remote-write target {self.name}: tls_config needs both cert_file and key_file")
        if (self.bearer_token_file or self.bearer_token) and self.basic_user:
            raise TargetError(f"remote-write target {self.name}: bearer token and basic_auth are exclusive")

    def authorization(self) -> str | None:
        """The Authorization header, reading the secret files now (they may be rotated)."""
        if self.bearer_token_file is not None:
            return "Bearer " + self.bearer_token_file.read_text().strip()
        if self.bearer_token:
            return "Bearer " + self.bearer_token
        if self.basic_user is not None:
            import base64

            pw = self.basic_password_file.read_text().strip() if self.basic_password_file else (
                self.basic_password or "")
            return "Basic " + base64.b64encode(f"{self.basic_user}:{pw}".encode()).decode()
        return None

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx


def default_name(url: str) -> str:
    parts = urlsplit(url)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{parts.hostname}-{parts.port or ''}".strip("-"))
    return f"{host}-{hashlib.sha1(url.encode()).hexdigest()[:8]}"


def target_from_url(url: str) -> TargetConfig:
    return TargetConfig(url=url, name=default_name(url))


def _seconds(v: Any, where: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return parse_duration_ms(v, where) / 1000
        except Exception:
            pass
    raise TargetError(f"{where}: {v!r} is not a duration")


def _path(v: Any, where: str) -> Path:
    if not isinstance(v, str) or not v:
        raise TargetError(f"{where}: expected a file path")
    p = Path(v)
    if not p.is_file():
        raise TargetError(f"{where}: {v} is not a readable file")
    return p


def _entry(item: Any, where: str) -> TargetConfig:
    if not isinstance(item, dict):
        raise TargetError(f"{where}: expected a mapping, got {type(item).__name__}")
    unknown = sorted(set(map(str, item)) - _FIELDS)
    if unknown:
        raise TargetError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
    url = item.get("url")
    if not isinstance(url, str):
        raise TargetError(f"{where}: url is required")
    kw: dict[str, Any] = {"url": url, "name": str(item.get("name") or default_name(url))}
    if "protocol" in item:
        kw["protocol"] = str(item["protocol"])
    if "write_relabel_configs" in item:
        import yaml  # only with a config file: ~1 MiB less in a store that has none

        try:
            kw["relabel"] = parse_rules(yaml.safe_dump(item["write_relabel_configs"]),
                                        f"{where}: write_relabel_configs")
        except RelabelConfigError as e:
            raise TargetError(str(e)) from None
    if "bearer_token_file" in item:
        kw["bearer_token_file"] = _path(item["bearer_token_file"], f"{where}: bearer_token_file")
    if "bearer_token" in item:
        kw["bearer_token"] = str(item["bearer_token"])
    if "basic_auth" in item:
        ba = item["basic_auth"]
        if not isinstance(ba, dict) or not isinstance(ba.get("username"), str):
            raise TargetError(f"{where}: basic_auth needs a username")
        kw["basic_user"] = ba["username"]
        if "password_file" in ba:
            kw["basic_password_file"] = _path(ba["password_file"], f"{where}: basic_auth.password_file")
        elif "password" in ba:
            kw["basic_password"] = str(ba["password"])
    tls = item.get("tls_config") or {}
    if not isinstance(tls, dict) or set(tls) - _TLS:
        raise TargetError(f"{where}: tls_config takes {', '.join(sorted(_TLS))}")
    for key, field in (("ca_file", "ca_file"), ("cert_file", "cert_file"), ("key_file", "key_file")):
        if key in tls:
            kw[field] = _path(tls[key], f"{where}: tls_config.{key}")
    if "server_name" in tls:
        kw["server_name"] = str(tls["server_name"])
    kw["insecure_skip_verify"] = bool(tls.get("insecure_skip_verify", False))
    if "remote_timeout" in item:
        kw["timeout_s"] = _seconds(item["remote_timeout"], f"{where}: remote_timeout")
    q = item.get("queue_config") or {}
    if not isinstance(q, dict) or set(q) - _QUEUE:
        raise TargetError(f"{where}: queue_config takes {', '.join(sorted(_QUEUE))}")
    for key in ("shards", "max_samples_per_send"):
        if key in q:
            if not isinstance(q[key], int) or isinstance(q[key], bool):
                raise TargetError(f"{where}: queue_config.{key} must be an integer")
            kw[key] = q[key]
    if "min_backoff" in q:
        kw["min_backoff_s"] = _seconds(q["min_backoff"], f"{where}: queue_config.min_backoff")
    if "max_backoff" in q:
        kw["max_backoff_s"] = _seconds(q["max_backoff"], f"{where}: queue_config.max_backoff")
    if "retry_on_http_429" in q:
        kw["retry_on_429"] = bool(q["retry_on_http_429"])
    try:
        return TargetConfig(**kw)
    except TargetError as e:
        raise TargetError(f"{where}: {e}") from None


def parse_targets(urls: list[str], config_text: str | None = None, source: str = "remote-write config"
                  ) -> list[TargetConfig]:
    """Targets from ``--remote-write-url`` flags and a config file's text (a YAML list of entries,
    or a mapping with a ``remote_write`` list, as in prometheus.yml). Raises TargetError."""
    out = [target_from_url(u) for u in urls]
    if config_text is not None:
        import yaml  # only with a config file: ~1 MiB less in a store that has none

        try:
            doc = yaml.safe_load(config_text)
        except yaml.YAMLError as e:
            raise TargetError(f"{source}: not YAML: {e}") from None
        if isinstance(doc, dict):
            doc = doc.get("remote_write")
        if not isinstance(doc, list):
            raise TargetError(f"{source}: expected a list of remote_write entries")
        out += [_entry(item, f"{source}: entry {i + 1}") for i, item in enumerate(doc)]
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TargetError(f"{source}: two targets named {dup[0]!r} (give them distinct names)")
    return out
