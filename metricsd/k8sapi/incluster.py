"""Read the front proxy's settings from the API server, as every aggregated API server does: the
``kube-system/extension-apiserver-authentication`` ConfigMap, readable through the
``extension-apiserver-authentication-reader`` Role (deploy/kubernetes/k8s-api.yaml binds it).
A ConfigMap of another namespace cannot be mounted, hence this one request at start."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp

from metricsd.k8sapi.requestheader import RequestHeaderSettings, settings_from_configmap
from metricsd.security.tls import ClientTLS

__all__ = ["CONFIGMAP_PATH", "fetch_requestheader"]

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONFIGMAP_PATH = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"


async def fetch_requestheader(ca_out: Path, api_url: str | None = None, sa_dir: Path = SA_DIR,
                              timeout_s: float = 10.0) -> RequestHeaderSettings:
    """Write the request-header CA to ``ca_out`` and return the settings. Raises ValueError saying
    what failed (not in a pod, the request refused, no CA in the ConfigMap)."""
    if api_url is None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ValueError("--requestheader-from-cluster needs KUBERNETES_SERVICE_HOST (run in a pod)")
        api_url = f"https://{host}:{port}"
    try:
        token = (sa_dir / "token").read_text().strip()
    except OSError as e:
        raise ValueError(f"cannot read the ServiceAccount token: {e}") from e
    ssl = ClientTLS(ca=sa_dir / "ca.crt").ssl_context()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session, \
                session.get(api_url.rstrip("/") + CONFIGMAP_PATH, ssl=ssl,
                            headers={"Authorization": f"Bearer {token}"}) as resp:
            if resp.status != 200:
                raise ValueError(f"GET {CONFIGMAP_PATH}: HTTP {resp.status}: {(await resp.text())[:200]}")
            doc = await resp.json()
    except (aiohttp.ClientError, TimeoutError) as e:
        raise ValueError(f"GET {CONFIGMAP_PATH}: {e}") from e
    ca, settings = settings_from_configmap(doc.get("data") or {} if isinstance(doc, dict) else {})
    if not ca:
        raise ValueError("extension-apiserver-authentication has no requestheader-client-ca-file: the API "
                         "server runs without --requestheader-client-ca-file")
    ca_out.write_text(ca)
    return settings
