"""``metricsd token``: make bearer tokens and the lines of a token file.

``metricsd token new --name grafana --role read`` prints the new token (give it to the client;
it is not stored anywhere) and, on the next line, the line to add to the ``--tokens-file``.
``metricsd token hash`` prints the line for a token read from standard input. ``metricsd token
pki DIR`` writes a throw-away CA and a loopback certificate for trying TLS out (never for
production).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metricsd.security.tokens import TokenFileError, hash_token, new_token, parse_roles

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="make bearer tokens, token-file lines and a throw-away CA")
    actions = p.add_subparsers(dest="token_command", required=True)
    new = actions.add_parser("new", help="a new random token and its token-file line")
    new.add_argument("--name", required=True, help="who holds it (appears in the logs)")
    new.add_argument("--role", required=True, help="read, write, admin, or several comma-separated")
    h = actions.add_parser("hash", help="the token-file line of a token read from standard input")
    h.add_argument("--name", required=True)
    h.add_argument("--role", required=True)
    pki = actions.add_parser("pki", help="a throw-away CA and a certificate for 127.0.0.1 and localhost")
    pki.add_argument("dir", type=Path)
    p.set_defaults(run=run)


def line(name: str, roles: str, token: str) -> str:
    return f"{name} {roles} {hash_token(token)}"


def run(args: argparse.Namespace) -> int:
    if args.token_command == "pki":
        from metricsd.security.certs import create_local_pki  # cryptography: 8 MiB, only for this

        pki = create_local_pki(args.dir)
        print(f"CA {pki.ca}\ncertificate {pki.cert}\nkey {pki.key}")
        return 0
    try:
        roles = ",".join(sorted(r.value for r in parse_roles(args.role)))
    except TokenFileError as e:
        print(f"metricsd token: {e}", file=sys.stderr)
        return 2
    if args.token_command == "new":
        token = new_token()
        print(token)
    else:
        token = sys.stdin.readline().strip()
        if not token:
            print("metricsd token hash: no token on standard input", file=sys.stderr)
            return 2
    print(line(args.name, roles, token))
    return 0
