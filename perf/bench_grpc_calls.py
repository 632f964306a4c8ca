"""What a gRPC call costs in Python, at each end: a unary call against a message on an open stream.

The floor under every metricsd hop (agent -> proxy -> stores): a trivial echo service on 127.0.0.1
in a process of its own, a client in this one, payloads the size of an agent's live batch
(1,000 series x 1 sample, ~12 KB). CPU per call from the processes' own counters. The
conclusion drawn from it is in perf/RESULTS.md ("Through a proxy", rpc WriteStream).

    .venv/bin/python perf/bench_grpc_calls.py [--calls 3000] [--payload 12000] [--loop asyncio|uvloop]

``--loop`` picks both processes' event loop. Beside gRPC it measures the floor a leaner internal
transport would stand on (issue 23): length-prefixed frames over one asyncio stream, each with a
request id, answered by a server that echoes the id (multiplexed: several in flight on one
connection), so the two can be compared on the same payloads.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import struct
import subprocess
import sys
import time
from typing import Any

import grpc
from bench_proxy import _free_port
from procstat import cpu_seconds

_SERVICE = "bench.Echo"


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_HEAD = struct.Struct("<IQ")  # frame: body length, request id


async def _raw_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            n, rid = _HEAD.unpack(await reader.readexactly(_HEAD.size))
            await reader.readexactly(n)
            writer.write(_HEAD.pack(2, rid) + b"ok")
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def _serve(port: int) -> None:
    raw = await asyncio.start_server(_raw_conn, "127.0.0.1", port + 1)
    server = grpc.aio.server()

    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"ok"

    async def stream(requests: object, context: grpc.aio.ServicerContext) -> object:
        async for _ in requests:  # type: ignore[attr-defined]
            yield b"ok"

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    }),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    async with raw:
        await server.wait_for_termination()


async def _unary(channel: grpc.aio.Channel, payload: bytes, calls: int, in_flight: int) -> None:
    call = channel.unary_unary(f"/{_SERVICE}/Unary")
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await call(payload)

    await asyncio.gather(*(one() for _ in range(calls)))


async def _stream(channel: grpc.aio.Channel, payload: bytes, calls: int, in_flight: int) -> None:
    call = channel.stream_stream(f"/{_SERVICE}/Stream")()
    sem = asyncio.Semaphore(in_flight)

    async def read() -> None:
        for _ in range(calls):
            await call.read()
            sem.release()

    reader = asyncio.create_task(read())
    for _ in range(calls):
        await sem.acquire()
        await call.write(payload)
    await reader
    await call.done_writing()


class _RawClient:
    """Frames with a request id over one connection; answers matched to their futures by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.waiting: dict[int, asyncio.Future[bytes]] = {}
        self.next_id = 0
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            n, rid = _HEAD.unpack(await self.reader.readexactly(_HEAD.size))
            body = await self.reader.readexactly(n)
            self.waiting.pop(rid).set_result(body)

    async def call(self, payload: bytes) -> bytes:
        self.next_id += 1
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = fut
        self.writer.write(_HEAD.pack(len(payload), self.next_id) + payload)
        return await fut


async def _raw(client: _RawClient, payload: bytes, calls: int, in_flight: int) -> None:
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await client.call(payload)

    await asyncio.gather(*(one() for _ in range(calls)))


async def measure(port: int, server_pid: int, calls: int, payload_size: int) -> list[tuple[str, float, float, float]]:
    payload = os.urandom(payload_size)
    rows = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.unary_unary(f"/{_SERVICE}/Unary")(payload)  # connected
        for name, fn, in_flight in (("unary call", _unary, 1), ("unary call", _unary, 4),
                                    ("stream message", _stream, 1), ("stream message", _stream, 4)):
            c0, s0, t0 = _own_cpu(), cpu_seconds(server_pid), time.perf_counter()
            await fn(channel, payload, calls, in_flight)
            c1, s1, t1 = _own_cpu(), cpu_seconds(server_pid), time.perf_counter()
            rows.append((f"{name}, {in_flight} in flight", (c1 - c0) / calls * 1e6, (s1 - s0) / calls * 1e6,
                         (t1 - t0) / calls * 1e6))
    reader, writer = await asyncio.open_connection("127.0.0.1", port + 1)
    client = _RawClient(reader, writer)
    await client.call(payload)
    for in_flight in (1, 4):
        c0, s0, t0 = _own_cpu(), cpu_seconds(server_pid), time.perf_counter()
        await _raw(client, payload, calls, in_flight)
        c1, s1, t1 = _own_cpu(), cpu_seconds(server_pid), time.perf_counter()
        rows.append((f"asyncio stream, id-multiplexed frame, {in_flight} in flight", (c1 - c0) / calls * 1e6,
                     (s1 - s0) / calls * 1e6, (t1 - t0) / calls * 1e6))
    client.task.cancel()
    writer.close()
    return rows


def _run(coro: Any, loop: str) -> Any:
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def _wait_listening(port: int, server: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            time.sleep(0.2)  # the gRPC port was bound before this one
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the echo server did not start")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--payload", type=int, default=12_000, help="bytes per request")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="both processes' event loop")
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        _run(_serve(args.serve), args.loop)
        return
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--loop", args.loop])
    try:
        _wait_listening(port + 1, server)
        rows = _run(measure(port, server.pid, args.calls, args.payload), args.loop)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"command: .venv/bin/python perf/bench_grpc_calls.py {' '.join(sys.argv[1:])}  "
          f"(grpcio {grpc.__version__}, {os.cpu_count()} cores, {args.loop}, load {os.getloadavg()[0]:.1f})")
    print("| exchange (12 KB request, 2 B answer) | client CPU us | server CPU us | wall us |")
    print("| --- | --- | --- | --- |")
    for name, client_us, server_us, wall_us in rows:
        print(f"| {name} | {client_us:.0f} | {server_us:.0f} | {wall_us:.0f} |")


if __name__ == "__main__":
    main()
