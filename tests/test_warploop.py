"""tests/warploop.py: the test loop whose clock jumps to its next timer."""

from __future__ import annotations

import asyncio
import time

from warploop import run_warped


def test_timers_run_in_order_at_their_loop_times_without_waiting() -> None:
    async def main() -> tuple[float, list[tuple[float, float]]]:
        loop = asyncio.get_running_loop()
        ran: list[tuple[float, float]] = []

        async def one(delay: float) -> None:
            await asyncio.sleep(delay)
            ran.append((delay, loop.time()))

        await asyncio.gather(one(30.0), one(10.0), one(20.0))
        return loop.time(), ran

    began = time.monotonic()
    now, ran = run_warped(main())
    assert ran == [(10.0, 10.0), (20.0, 20.0), (30.0, 30.0)] and now == 30.0
    assert time.monotonic() - began < 5.0  # a real loop would take 30 s


def test_a_ready_socket_is_answered_before_the_clock_moves() -> None:
    async def main() -> tuple[bytes, float]:
        loop = asyncio.get_running_loop()

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readexactly(4))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        got = await reader.readexactly(4)
        writer.close()
        server.close()
        await server.wait_closed()
        return got, loop.time()

    got, now = run_warped(main())
    assert got == b"ping" and now == 0.0
