"""Stopping background tasks without ever hanging shutdown."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task[None] | None, timeout_s: float = 5.0) -> None:
    """Cancel `task` and wait for it, at most `timeout_s`.

    Bounded because a client library can turn the cancellation into its own error (redis-py does,
    mid-read); a loop that swallows that error would otherwise keep shutdown waiting forever.
    """
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        async with asyncio.timeout(timeout_s):
            await task
