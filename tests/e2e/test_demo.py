"""The README's demo command works: it starts, and a streaming completion succeeds."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

import aiohttp
import pytest

from tests.support.processes import running_demo

pytestmark = pytest.mark.e2e


async def test_demo_streams_a_completion() -> None:
    await assert_demo_streams_a_completion({**os.environ, "LOG_LEVEL": "WARNING"})


async def assert_demo_streams_a_completion(env: Mapping[str, str], cwd: str | None = None) -> None:
    """Start `python -m mlpa_aiohttp demo` with `env` (from `cwd`), run the curl it prints, stop it."""
    with running_demo(env, cwd) as (process, port):
        ready = process.stdout.readline()
        assert f"http://127.0.0.1:{port}" in ready, ready
        curl = process.stdout.readline()
        token = re.search(r"authorization: Bearer (\S+?)'", curl).group(1)
        body = re.search(r"-d '(.*)'", curl).group(1)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=body,
                headers={"authorization": f"Bearer {token}", "service-type": "ai", "content-type": "application/json"},
            ) as response:
                assert response.status == 200
                text = await response.text()
        events = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        content = "".join(
            (json.loads(e)["choices"][0]["delta"] or {}).get("content") or ""
            for e in events[:-1]
            if json.loads(e).get("choices")
        )
        assert content
