"""Token files, roles, the policy tables and the Authenticator: pure, no I/O but a temp file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metricsd.security.auth import Authenticator, PermissionDenied, Unauthenticated
from metricsd.security.policy import grpc_role, http_role
from metricsd.security.tokens import Identity, Role, TokenFile, TokenFileError, hash_token, parse_token_file


def test_a_token_file_maps_hashes_to_names_and_roles() -> None:
    ids = parse_token_file([f"agent write {hash_token('a')}  # the node agents", "", "# comment",
                            f"ops read,write {hash_token('o')}"])
    assert ids[hash_token("a")] == Identity("agent", frozenset({Role.WRITE}))
    assert ids[hash_token("o")].roles == {Role.READ, Role.WRITE}


@pytest.mark.parametrize("line, message", [
    ("agent write", "line 1: expected 'name roles sha256:<hex>', got 2 fields"),
    ("agent write s3cret", "line 1: the hash must be sha256:<64 hex digits> (never the token)"),
    ("agent write sha256:" + "z" * 64, "line 1: the hash is not hexadecimal"),
    (f"agent owner {hash_token('a')}", "line 1: unknown role in 'owner': use read, write or admin"),
])
def test_a_bad_line_is_refused_naming_the_line_and_why(line: str, message: str) -> None:
    with pytest.raises(TokenFileError) as e:
        parse_token_file([line], "tokens")
    assert str(e.value) == f"tokens {message}"


def test_the_same_token_twice_is_refused() -> None:
    with pytest.raises(TokenFileError, match="line 2: the same token as a"):
        parse_token_file([f"a read {hash_token('t')}", f"b write {hash_token('t')}"], "tokens")


def test_admin_holds_every_role() -> None:
    admin = Identity("ops", frozenset({Role.ADMIN}))
    assert all(admin.has(r) for r in Role)
    assert not Identity("graf", frozenset({Role.READ})).has(Role.WRITE)


def test_the_token_file_is_read_again_when_it_changes_and_a_bad_edit_keeps_the_old(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"a read {hash_token('t1')}\n")
    now = [0.0]
    tokens = TokenFile(path, monotonic=lambda: now[0])
    assert tokens.identify("t1") is not None and tokens.identify("t2") is None
    path.write_text(f"b write {hash_token('t2')}\n")
    os.utime(path, (1, 1))
    now[0] = 2.0
    assert tokens.identify("t2") == Identity("b", frozenset({Role.WRITE})) and tokens.identify("t1") is None
    path.write_text("garbage\n")
    os.utime(path, (5, 5))
    now[0] = 4.0
    assert tokens.identify("t2") is not None  # the last good file stays in force


def test_policy_tables() -> None:
    assert grpc_role("/metricsd.v1.Metrics/Write") is Role.WRITE
    assert grpc_role("/metricsd.v1.Metrics/Aggregate") is Role.READ
    assert grpc_role("/metricsd.v1.Metrics/CatchUp") is Role.ADMIN
    assert grpc_role("/grpc.health.v1.Health/Check") is None
    assert grpc_role("/metricsd.v1.Metrics/SomethingNew") is Role.ADMIN  # closed until decided
    assert http_role("POST", "/api/v1/write") is Role.WRITE
    assert http_role("GET", "/api/v1/query") is Role.READ
    assert http_role("GET", "/") is None and http_role("GET", "/static/app.js") is None


async def test_the_authenticator_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"graf read {hash_token('r')}\n")
    auth = Authenticator(TokenFile(path))
    for header, message in [(None, "no bearer token"), ("Basic abc", "is not 'Bearer <token>'"),
                            ("Bearer nope", "unknown or expired token")]:
        with pytest.raises(Unauthenticated, match=message):
            await auth.check(header, Role.READ, "GET /api/v1/query", "127.0.0.1")
    assert (await auth.check("Bearer r", Role.READ, "GET /api/v1/query", "127.0.0.1")) is not None
    with pytest.raises(PermissionDenied) as e:
        await auth.check("Bearer r", Role.WRITE, "POST /api/v1/write", "127.0.0.1")
    assert str(e.value) == "graf (roles: read) may not call POST /api/v1/write: it needs role write"
    assert await auth.check(None, None, "GET /", "127.0.0.1") is None  # open routes need nothing


async def test_an_internal_token_lives_in_memory_only(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("")
    auth = Authenticator(TokenFile(path))
    token = auth.issue_internal("up-simulated-agent", frozenset({Role.WRITE}))
    identity = await auth.check(f"Bearer {token}", Role.WRITE, "Write", "127.0.0.1")
    assert identity is not None and identity.source == "internal"
    assert hash_token(token) not in path.read_text()


def test_a_client_token_file_is_read_again_when_it_is_rotated(tmp_path: Path) -> None:
    from metricsd.security.settings import ClientSecurity

    path = tmp_path / "token"
    path.write_text("first\n")
    client = ClientSecurity(token_file=path)
    assert client.bearer() == "first" and client.headers() == {"Authorization": "Bearer first"}
    assert client._source is not None
    client._source.check_every_s = 0.0
    path.write_text("second\n")
    os.utime(path, (os.stat(path).st_mtime + 5,) * 2)
    assert client.bearer() == "second"
    path.unlink()
    assert client.bearer() == "second"  # a file that went away keeps the last token
    assert ClientSecurity(token_file=tmp_path / "missing").headers() == {}
