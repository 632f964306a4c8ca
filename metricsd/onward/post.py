"""A small HTTP/1.1 client for the senders' POSTs: keep-alive connections, one request at a time each.

aiohttp's client cost about 400 us of CPU for a 700 KB remote-write request to a local receiver,
where writing the request line, the headers and the body on an asyncio stream and reading the
answer cost about 150 (2026-11-27 session 34, perf/RESULTS.md): at 10,000 samples a request that is
0.03 CPU s per million samples of the 0.5 budget. A sender needs little of HTTP: POST one body
with a Content-Length, read a status, the headers, and a body of a known length (Content-Length,
chunked, or up to the end of the connection); TLS through asyncio's streams.

Connections are kept (``keep`` of them idle at most) and reused; a connection whose answer
said ``Connection: close``, could not be read whole, or is an HTTP/1.0 one without a length is
closed. Any failure (refused, reset, timeout, an answer that is not HTTP) raises
:class:`PostError`, and the connection is dropped. Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Answer", "PostError", "Poster"]

_MAX_HEAD = 64 * 1024  # the status line and headers of an answer
_MAX_BODY = 1 << 20  # an answer's body a sender reads (an error message); past it, the connection is closed


class PostError(Exception):
    """The request got no HTTP answer (connection refused or lost, timeout, not HTTP)."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes  # at most _MAX_BODY


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class Poster:
    """POSTs to one URL over kept connections."""

    def __init__(self, url: str, *, ssl_context: ssl.SSLContext | None, server_name: str | None = None,
                 timeout_s: float = 30.0, keep: int = 4) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r}: not an http(s) URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl_context if parts.scheme == "https" else None
        self.server_name = server_name or self.host
        self.timeout_s = timeout_s
        self.keep = keep
        path = parts.path or "/"
        target = path + ("?" + parts.query if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        self._start = f"POST {target} HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1")
        self._idle: list[_Conn] = []

    async def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()

    async def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """Raises PostError when no answer came."""
        conn = self._idle.pop() if self._idle else None
        reused = conn is not None
        try:
            async with asyncio.timeout(self.timeout_s):
                if conn is None:
                    conn = await self._connect()
                try:
                    answer, again = await self._exchange(conn, body, headers)
                except (ConnectionError, asyncio.IncompleteReadError):
                    if not reused:
                        raise
                    conn.close()  # a kept connection the receiver closed while idle: once more on a new one
                    conn = None
                    conn = await self._connect()
                    answer, again = await self._exchange(conn, body, headers)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError, ssl.SSLError) as e:
            if conn is not None:
                conn.close()
            raise PostError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if again and len(self._idle) < self.keep:
            self._idle.append(conn)
        else:
            conn.close()
        return answer

    async def _connect(self) -> _Conn:
        if self.ssl is not None:
            r, w = await asyncio.open_connection(self.host, self.port, ssl=self.ssl, server_hostname=self.server_name)
        else:
            r, w = await asyncio.open_connection(self.host, self.port)
        return _Conn(r, w)

    async def _exchange(self, conn: _Conn, body: bytes, headers: dict[str, str]) -> tuple[Answer, bool]:
        """One request and its answer; and whether the connection may be used again."""
        head = [self._start]
        for k, v in headers.items():
            head.append(f"{k}: {v}\r\n".encode("latin-1"))
        head.append(b"Content-Length: %d\r\n\r\n" % len(body))
        conn.writer.writelines([b"".join(head), body])
        await conn.writer.drain()
        r = conn.reader
        while True:
            status_line = await r.readline()
            if not status_line:
                raise ConnectionResetError("the connection closed before an answer")
            fields = status_line.split(None, 2)
            if len(fields) < 2 or not fields[0].startswith(b"HTTP/1.") or not fields[1].isdigit():
                raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
            status = int(fields[1])
            got = await self._headers(r)
            if status >= 200 or status == 101:
                break  # 1xx (100 Continue, 103) precede the answer
        keep = fields[0] == b"HTTP/1.1" and got.get("connection", "").lower() != "close"
        if "chunked" in got.get("transfer-encoding", "").lower():
            data, whole = await self._chunked(r)
        elif "content-length" in got:
            n = int(got["content-length"])
            if n < 0:
                raise ValueError("negative Content-Length")
            data = await r.readexactly(min(n, _MAX_BODY))
            whole = n <= _MAX_BODY
        elif status in (204, 304):
            data, whole = b"", True
        else:  # the body runs to the end of the connection
            data, whole, keep = await r.read(_MAX_BODY), False, False
        return Answer(status, got, data), keep and whole

    @staticmethod
    async def _headers(r: asyncio.StreamReader) -> dict[str, str]:
        out: dict[str, str] = {}
        size = 0
        while True:
            line = await r.readline()
            size += len(line)
            if size > _MAX_HEAD:
                raise ValueError("an answer's headers past 64 KiB")
            if line in (b"\r\n", b"\n"):
                return out
            if not line:
                raise ConnectionResetError("the connection closed in an answer's headers")
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                out[name.strip().lower()] = value.strip()

    @staticmethod
    async def _chunked(r: asyncio.StreamReader) -> tuple[bytes, bool]:
        parts: list[bytes] = []
        size = 0
        while True:
            line = await r.readline()
            n = int(line.split(b";", 1)[0].strip() or b"x", 16)
            if n == 0:
                await Poster._headers(r)  # trailers, then the empty line
                return b"".join(parts), True
            if size + n > _MAX_BODY:
                return b"".join(parts), False
            parts.append(await r.readexactly(n))
            size += n
            await r.readexactly(2)
