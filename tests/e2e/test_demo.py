"""The README's demo command works: it starts, and a streaming completion succeeds."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_demo_streams_a_completion() -> None:
    await assert_demo_streams_a_completion({**os.environ, "LOG_LEVEL": "WARNING"})


async def assert_demo_streams_a_completion(env: dict[str, str], cwd: str | None = None) -> None:
    """Start `python -m mlpa_aiohttp demo` with `env` (from `cwd`), run the curl it prints, stop it."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mlpa_aiohttp", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
    )
    try:
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
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=10) == 0
        finally:
            process.kill()
