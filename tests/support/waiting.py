"""Waiting in tests for something the service does on its own schedule."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


async def wait_for(condition: Callable[[], Any], timeout: float = 2.0, *, interval: float = 0.005) -> None:
    """Return once `condition()` is true; fail the test if it is not within `timeout`.

    The timeout only bounds a test that would otherwise hang; what the tests assert is that
    the condition comes true, never how fast.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
