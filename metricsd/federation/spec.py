"""The clusters a federating proxy serves, from ``--cluster NAME=HOST:PORT`` flags or a YAML file.

Pure: parsing and checks only, so a typo stops ``metricsd federate`` before it listens, with the
flag (or file) named. A name becomes the value of every returned series' ``cluster`` label, so it
must be a label value a selector can name plainly: letters, digits, ``_``, ``-`` and ``.``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["ClusterTarget", "SpecError", "load_clusters_file", "parse_cluster_flag", "parse_clusters"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_MAX_CLUSTERS = 256


class SpecError(ValueError):
    """A cluster flag or file that cannot be used; the message names the flag or file."""


@dataclass(frozen=True)
class ClusterTarget:
    name: str
    address: str  # host:port of the cluster's proxy (gRPC)


def _check_address(address: str, where: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"{where}: address {address!r} is not HOST:PORT with a port in 1..65535")
    return address


def _check_name(name: str, where: str) -> str:
    if not _NAME_RE.match(name):
        raise SpecError(f"{where}: cluster name {name!r} must be 1-63 letters, digits, '_', '-' or '.', "
                        "starting with a letter or digit")
    return name


def parse_cluster_flag(text: str) -> ClusterTarget:
    """``NAME=HOST:PORT``; raises SpecError naming ``--cluster``."""
    name, sep, address = text.partition("=")
    if not sep:
        raise SpecError(f"--cluster {text!r}: expected NAME=HOST:PORT (e.g. eu-1=127.0.0.1:7401)")
    where = f"--cluster {text!r}"
    return ClusterTarget(_check_name(name.strip(), where), _check_address(address.strip(), where))


def parse_clusters(targets: Iterable[ClusterTarget], where: str = "--cluster") -> list[ClusterTarget]:
    """Checks the whole set: at least one, at most 256, no name twice."""
    out: list[ClusterTarget] = []
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise SpecError(f"{where}: cluster name {t.name!r} given twice")
        seen.add(t.name)
        out.append(t)
    if not out:
        raise SpecError(f"{where}: no clusters given (--cluster NAME=HOST:PORT or --clusters-file FILE)")
    if len(out) > _MAX_CLUSTERS:
        raise SpecError(f"{where}: {len(out)} clusters, more than the limit of {_MAX_CLUSTERS}")
    return out


def clusters_from_document(doc: Any, where: str) -> list[ClusterTarget]:
    """``{"clusters": {NAME: ADDR, ...}}`` or ``{"clusters": [{"name": N, "address": A}, ...]}``."""
    if not isinstance(doc, dict) or "clusters" not in doc:
        raise SpecError(f"{where}: expected a mapping with a 'clusters' key")
    raw = doc["clusters"]
    items: Sequence[tuple[Any, Any]]
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        pairs = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict) or set(entry) != {"name", "address"}:
                raise SpecError(f"{where}: clusters[{i}] must be a mapping with exactly 'name' and 'address'")
            pairs.append((entry["name"], entry["address"]))
        items = pairs
    else:
        raise SpecError(f"{where}: 'clusters' must be a mapping of name to address, or a list")
    out = []
    for name, address in items:
        if not isinstance(name, str) or not isinstance(address, str):
            raise SpecError(f"{where}: cluster {name!r}: name and address must be strings")
        out.append(ClusterTarget(_check_name(name, where), _check_address(address, where)))
    return parse_clusters(out, where)


def load_clusters_file(text: str, where: str) -> list[ClusterTarget]:
    """Parse the YAML text of a clusters file (``where`` names it in errors)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{where}: not valid YAML: {e}") from None
    return clusters_from_document(doc, where)
