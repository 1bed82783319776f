"""The README's demo command works: it starts, and a streaming completion succeeds."""

from __future__ import annotations

import os

from tests.support.processes import assert_demo_streams_a_completion


async def test_demo_streams_a_completion() -> None:
    await assert_demo_streams_a_completion({**os.environ, "LOG_LEVEL": "WARNING"})
