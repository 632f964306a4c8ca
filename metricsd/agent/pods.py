"""Pod metadata for the collector: the kubelet's ``/pods`` answer (a v1 PodList), from a file or HTTPS.

The cgroup tree knows only pod UIDs and container ids; the pod list turns them into namespace,
pod and container names, the owning workload, the QoS class and each container's requests and
limits. Parsing is pure and forgiving: a pod that cannot be understood is skipped and counted,
never allowed to sink the whole list.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

__all__ = [
    "ContainerSpec",
    "PodIndex",
    "PodInfo",
    "PodListError",
    "fetch_pod_list",
    "load_pod_list",
    "parse_pod_list",
    "parse_pod_list_json",
    "parse_quantity",
    "qos_class",
    "workload_of",
]

_QUANTITY_RE = re.compile(r"^([+-]?)(\d*)(?:\.(\d*))?([a-zA-Z]*[+-]?\d*)$")
_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_EXPONENT_RE = re.compile(r"^[eE]([+-]?\d+)$")
# The alphabet of pod-template-hash (k8s.io/apimachinery rand.SafeEncodeString): no vowels, no
# look-alike characters, so a real word in a Deployment's name rarely matches it.
_TEMPLATE_HASH_RE = re.compile(r"^[bcdfghjklmnpqrstvwxz2456789]{6,10}$")
_RUNTIME_PREFIX_RE = re.compile(r"^[a-z0-9.+-]+://")
_RESOURCES = ("cpu", "memory")


class PodListError(ValueError):
    """The pod list as a whole is unusable (not JSON, not a PodList); the message says why."""


def parse_quantity(text: str) -> float:
    """A Kubernetes resource quantity in base units: cores for CPU, bytes for memory.

    Follows k8s.io/apimachinery's resource.Quantity grammar: a signed decimal number, then either
    a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T P E) or a decimal exponent
    (e3, E-2). ``"100m"`` is 0.1, ``"128Mi"`` is 134217728, ``"1e3"`` is 1000, ``"E"`` alone is exa.

    Raises ValueError naming the text when it is not a quantity.
    """
    m = _QUANTITY_RE.match(text.strip()) if isinstance(text, str) else None
    if m is None or not (m.group(2) or m.group(3)):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    sign, whole, frac, suffix = m.groups()
    try:
        number = Decimal(f"{sign}{whole or '0'}.{frac or '0'}")
    except InvalidOperation as e:  # pragma: no cover - the regex admits only digits
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from e
    if suffix in _BINARY_SUFFIXES:
        return float(number * (Decimal(1024) ** _BINARY_SUFFIXES[suffix]))
    if suffix in _DECIMAL_SUFFIXES:
        return float(number.scaleb(_DECIMAL_SUFFIXES[suffix]))
    exp = _EXPONENT_RE.match(suffix)
    if exp is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r} (unknown suffix {suffix!r})")
    return float(number.scaleb(int(exp.group(1))))


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """A container's resources in base units (cores, bytes); a resource not set is absent."""

    name: str
    requests: Mapping[str, float] = field(default_factory=dict)
    limits: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str
    workload: str  # the owning Deployment, StatefulSet, DaemonSet, Job...; "" for a bare pod
    workload_kind: str
    qos: str  # Guaranteed, Burstable or BestEffort, as Kubernetes spells it
    phase: str
    containers: tuple[ContainerSpec, ...]
    # Runtime container id (without its "containerd://" prefix) -> container name, for the
    # containers, init containers and ephemeral containers the kubelet reports.
    container_ids: Mapping[str, str]


@dataclass(slots=True)
class PodIndex:
    """Pods by UID, plus the pods that were skipped and why."""

    pods: dict[str, PodInfo] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)

    def get(self, uid: str) -> PodInfo | None:
        return self.pods.get(uid)

    def __len__(self) -> int:
        return len(self.pods)


def workload_of(metadata: Mapping[str, Any]) -> tuple[str, str]:
    """The workload owning a pod, as (kind, name); ("", "") for a pod nothing owns.

    A ReplicaSet is a Deployment's revision: its name is the Deployment's plus ``-<pod-template-hash>``,
    so the hash is stripped to name the Deployment, which outlives every rollout. A mirror pod's
    owner is its Node, which is no workload.
    """
    owners = metadata.get("ownerReferences") or []
    if not isinstance(owners, list):
        return "", ""
    chosen: Mapping[str, Any] | None = None
    for ref in owners:
        if isinstance(ref, Mapping) and ref.get("controller"):
            chosen = ref
            break
    if chosen is None:
        chosen = next((r for r in owners if isinstance(r, Mapping)), None)
    if chosen is None:
        return "", ""
    kind, name = str(chosen.get("kind", "")), str(chosen.get("name", ""))
    if kind == "Node" or not name:
        return "", ""
    if kind == "ReplicaSet":
        labels = metadata.get("labels") or {}
        template_hash = labels.get("pod-template-hash", "") if isinstance(labels, Mapping) else ""
        head, _, tail = name.rpartition("-")
        if head and (tail == template_hash if template_hash else _TEMPLATE_HASH_RE.match(tail)):
            return "Deployment", head
    return kind, name


def qos_class(containers: tuple[ContainerSpec, ...]) -> str:
    """The QoS class Kubernetes would assign, for pod lists that lack status.qosClass.

    Guaranteed: every container has CPU and memory limits equal to its requests (a request left
    out defaults to the limit). BestEffort: no container sets any. Burstable: everything else.
    """
    if not containers or all(not c.requests and not c.limits for c in containers):
        return "BestEffort"
    for c in containers:
        for r in _RESOURCES:
            limit = c.limits.get(r)
            if limit is None or c.requests.get(r, limit) != limit:
                return "Burstable"
    return "Guaranteed"


def _resources(section: Any, problems: Counter[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    if not isinstance(section, Mapping):
        return out
    for r in _RESOURCES:
        raw = section.get(r)
        if raw is None:
            continue
        try:
            # Hand-written fixtures sometimes carry numbers; the API server always sends strings.
            out[r] = parse_quantity(raw if isinstance(raw, str) else repr(raw))
        except ValueError:
            problems["bad_quantity"] += 1
    return out


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    ids: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            if not isinstance(cs, Mapping):
                continue
            cid, name = cs.get("containerID"), cs.get("name")
            if isinstance(cid, str) and cid and isinstance(name, str):
                ids[_RUNTIME_PREFIX_RE.sub("", cid)] = name
    return ids


def _parse_pod(pod: Any, problems: Counter[str]) -> PodInfo | None:
    if not isinstance(pod, Mapping):
        problems["not_an_object"] += 1
        return None
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not all(isinstance(meta.get(k), str) for k in ("uid", "name")):
        problems["no_uid_or_name"] += 1
        return None
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(status, Mapping)
    containers = []
    for c in spec.get("containers") or []:
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
            problems["bad_container"] += 1
            continue
        res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
        assert isinstance(res, Mapping)
        containers.append(
            ContainerSpec(
                name=c["name"],
                requests=_resources(res.get("requests"), problems),
                limits=_resources(res.get("limits"), problems),
            )
        )
    specs = tuple(containers)
    kind, workload = workload_of(meta)
    qos = status.get("qosClass")
    return PodInfo(
        uid=meta["uid"].lower(),
        namespace=str(meta.get("namespace") or "default"),
        name=meta["name"],
        node=str(spec.get("nodeName") or ""),
        workload=workload,
        workload_kind=kind,
        qos=qos if isinstance(qos, str) and qos else qos_class(specs),
        phase=str(status.get("phase") or ""),
        containers=specs,
        container_ids=_container_ids(status),
    )


def parse_pod_list(data: Any) -> PodIndex:
    """Index a decoded v1 PodList by pod UID. Raises PodListError only if ``data`` is no PodList."""
    if not isinstance(data, Mapping) or not isinstance(data.get("items", []), list):
        raise PodListError("not a PodList: expected an object with an 'items' list")
    index = PodIndex()
    for pod in data.get("items") or []:
        info = _parse_pod(pod, index.skipped)
        if info is not None:
            index.pods[info.uid] = info
    return index


def parse_pod_list_json(text: str | bytes) -> PodIndex:
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise PodListError(f"pod list is not JSON: {e}") from e
    return parse_pod_list(data)


def load_pod_list(path: str | Path) -> PodIndex:
    """Read a pods JSON file (the kubelet's /pods answer saved to disk). Raises PodListError, also
    when the file cannot be read, so the caller handles one exception type."""
    try:
        text = Path(path).read_bytes()
    except OSError as e:
        raise PodListError(f"cannot read pod list {path}: {e.strerror or e}") from e
    return parse_pod_list_json(text)


async def fetch_pod_list(
    url: str = "https://127.0.0.1:10250/pods",
    token_path: str | Path | None = "/var/run/secrets/kubernetes.io/serviceaccount/token",
    ca_path: str | Path | None = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    *,
    timeout_s: float = 5.0,
    insecure_skip_verify: bool = False,
) -> PodIndex:
    """Ask the kubelet for the pods on its node, as a service account would.

    The token is read on every call because projected service-account tokens rotate. The kubelet's
    serving certificate is often self-signed; ``insecure_skip_verify`` mirrors kubectl's flag for
    those clusters. Raises PodListError on any transport, HTTP or format failure.
    """
    import ssl

    import aiohttp

    headers = {"Accept": "application/json"}
    if token_path is not None:
        try:
            token = Path(token_path).read_text().strip()
        except OSError as e:
            raise PodListError(f"cannot read service-account token {token_path}: {e.strerror or e}") from e
        headers["Authorization"] = f"Bearer {token}"
    ssl_arg: ssl.SSLContext | bool = True
    if url.startswith("https://"):
        if insecure_skip_verify:
            ssl_arg = False
        elif ca_path is not None:
            try:
                ssl_arg = ssl.create_default_context(cafile=str(ca_path))
            except (OSError, ssl.SSLError) as e:
                raise PodListError(f"cannot load CA bundle {ca_path}: {e}") from e
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url, headers=headers, ssl=ssl_arg) as resp,
        ):
            if resp.status != 200:
                body = (await resp.text())[:200]
                raise PodListError(f"kubelet {url} answered HTTP {resp.status}: {body}")
            payload = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PodListError(f"cannot reach kubelet {url}: {e!r}") from e
    return parse_pod_list_json(payload)
