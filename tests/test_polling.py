"""The tests' polling helpers fail on their deadline, naming what they waited for."""

from __future__ import annotations

import pytest
from polling import wait_until, wait_until_sync


async def test_wait_until_takes_a_plain_or_a_coroutine_check_and_fails_at_its_deadline() -> None:
    seen: list[int] = []

    async def third_time() -> bool:
        seen.append(1)
        return len(seen) >= 3

    await wait_until("the third look", third_time, timeout_s=5.0)
    assert len(seen) == 3
    await wait_until("a plain check", lambda: True, timeout_s=0.0)
    with pytest.raises(AssertionError, match="waiting for never"):
        await wait_until("never", lambda: False, timeout_s=0.1)


def test_wait_until_sync_fails_at_its_deadline() -> None:
    wait_until_sync("a plain check", lambda: True, timeout_s=0.0)
    with pytest.raises(AssertionError, match="waiting for never"):
        wait_until_sync("never", lambda: 0, timeout_s=0.1)
