"""Bearer tokens with roles, from a file of hashes.

A token file holds one token per line, never the token itself but its SHA-256, so a leaked file
or backup gives nobody access::

    # name        roles        hash of the token
    agent         write        sha256:3f1c...
    grafana       read         sha256:9a0b...
    ops           admin        sha256:77de...

Roles: ``write`` (agents, remote write), ``read`` (dashboards, Grafana, the consumers) and
``admin`` (status, membership, the store-to-store RPCs), which includes the other two. A line may
list several roles, comma-separated. ``metricsd token new --name N --role R`` prints a new token
and its line. The file is read again when it changes (checked at most once a second), so tokens
are added or revoked without a restart.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Identity", "Role", "TokenFile", "TokenFileError", "hash_token", "new_token", "parse_token_file"]

log = logging.getLogger("metricsd.security")

_PREFIX = "sha256:"


class Role(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


class TokenFileError(ValueError):
    """A token file line that does not parse; the message names the file, the line and why."""


@dataclass(frozen=True)
class Identity:
    """Who a request comes from: a name for the logs and the roles it holds."""

    name: str
    roles: frozenset[Role]
    source: str = "token-file"

    def has(self, role: Role) -> bool:
        return role in self.roles or Role.ADMIN in self.roles


def hash_token(token: str) -> str:
    return _PREFIX + hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A random token: 32 bytes from the OS's CSPRNG, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def parse_roles(text: str) -> frozenset[Role]:
    try:
        return frozenset(Role(r.strip()) for r in text.split(",") if r.strip())
    except ValueError as e:
        raise TokenFileError(f"unknown role in {text!r}: use read, write or admin") from e


def parse_token_file(lines: Iterable[str], where: str = "token file") -> dict[str, Identity]:
    """hash -> identity. Raises TokenFileError naming the line of the first problem."""
    out: dict[str, Identity] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3:
            raise TokenFileError(f"{where} line {n}: expected 'name roles sha256:<hex>', got {len(parts)} fields")
        name, roles_text, digest = parts
        if not digest.startswith(_PREFIX) or len(digest) != len(_PREFIX) + 64:
            raise TokenFileError(f"{where} line {n}: the hash must be sha256:<64 hex digits> (never the token)")
        try:
            int(digest[len(_PREFIX):], 16)
        except ValueError as e:
            raise TokenFileError(f"{where} line {n}: the hash is not hexadecimal") from e
        try:
            roles = parse_roles(roles_text)
        except TokenFileError as e:
            raise TokenFileError(f"{where} line {n}: {e}") from e
        if not roles:
            raise TokenFileError(f"{where} line {n}: no role")
        if digest in out:
            raise TokenFileError(f"{where} line {n}: the same token as {out[digest].name}")
        out[digest] = Identity(name, roles)
    return out


class TokenFile:
    """The identities of a token file; raises TokenFileError at construction if it does not parse.
    A later edit that does not parse is logged and ignored (the last good file stays in force)."""

    def __init__(self, path: Path, monotonic: Callable[[], float] = time.monotonic, check_every_s: float = 1.0) -> None:
        self.path = Path(path)
        self.monotonic = monotonic
        self.check_every_s = check_every_s
        self._mtime = self._stat()
        self._by_hash = self._read()
        self._checked = monotonic()

    def _stat(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError as e:
            raise TokenFileError(f"cannot read the token file {self.path}: {e.strerror or e}") from e

    def _read(self) -> dict[str, Identity]:
        try:
            text = self.path.read_text()
        except OSError as e:
            raise TokenFileError(f"cannot read the token file {self.path}: {e.strerror or e}") from e
        return parse_token_file(text.splitlines(), str(self.path))

    def _maybe_reload(self) -> None:
        now = self.monotonic()
        if now - self._checked < self.check_every_s:
            return
        self._checked = now
        try:
            mtime = self._stat()
            if mtime != self._mtime:
                self._mtime = mtime
                self._by_hash = self._read()
                log.info("token file %s reloaded: %d tokens", self.path, len(self._by_hash))
        except TokenFileError as e:
            log.warning("token file changed but cannot be used (keeping the previous one): %s", e)

    def __len__(self) -> int:
        return len(self._by_hash)

    def identify(self, token: str) -> Identity | None:
        """The identity holding ``token``, or None. The lookup is by the token's SHA-256, so its
        timing says nothing about the token itself."""
        self._maybe_reload()
        return self._by_hash.get(hash_token(token))
