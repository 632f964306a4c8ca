"""A throw-away certificate authority for a local cluster and for the tests: one CA, one
certificate that serves as both server and client certificate (mutual TLS between components),
valid for the loopback names. ``metricsd cluster up`` makes one in its data directory so that a
local cluster runs with TLS and tokens on, as a real one should. Never for production: there,
certificates come from the operator (cert-manager, a corporate CA) and metricsd only reads them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LocalPKI", "create_local_pki", "issue_certificate"]

LOOPBACK = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class LocalPKI:
    ca: Path
    ca_key: Path
    cert: Path  # server and client certificate of every component
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o600)


def _names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def issue_certificate(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str,
                      hosts: Sequence[str], cert_path: Path, key_path: Path, days: int = 30) -> None:
    """A certificate for ``hosts`` (IPs and DNS names), usable as server and client certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)


def create_local_pki(directory: Path, hosts: Sequence[str] = LOOPBACK, days: int = 30) -> LocalPKI:
    """A CA and one component certificate under ``directory`` (created), valid ``days``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metricsd local CA")])
    ca_cert = (x509.CertificateBuilder()
               .subject_name(name).issuer_name(name)
               .public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    pki = LocalPKI(directory / "ca.crt", directory / "ca.key", directory / "metricsd.crt", directory / "metricsd.key")
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.ca_key, ca_key)
    issue_certificate(ca_cert, ca_key, "metricsd", hosts, pki.cert, pki.key, days)
    return pki
