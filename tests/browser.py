"""Headless Chromium for page tests, driven over the DevTools protocol.

`chromium_page()` starts a fresh browser with its own profile and yields a `Page`; tests
skip (one line, with the fix) where no Chromium is installed. Tests that use it live in
modules named `test_*_browser.py`, the slow tier's (tests/support/tiers.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest

from tests.support.tiers import require_slow_tier

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")) if p), None
)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
    "--remote-debugging-port=0",
)


class Page:
    """Just enough of the DevTools protocol: navigate, evaluate, wait, screenshot, and the
    URLs the page requested."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self.requested_urls: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        await self._ws.send_json({"id": message_id, "method": method, "params": params})
        async for message in self._ws:
            data = json.loads(message.data)
            if data.get("method") == "Network.requestWillBeSent":
                self.requested_urls.append(data["params"]["request"]["url"])
            if data.get("id") == message_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return dict(data["result"])
        raise RuntimeError("DevTools connection closed")

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        async with asyncio.timeout(timeout):
            while not (value := await self.evaluate(expression)):
                await asyncio.sleep(0.05)
        return value

    async def screenshot(self, path: Path) -> Path:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


LAUNCH_ATTEMPTS = 2
LAUNCH_SECONDS = 30


class ChromiumDidNotStart(RuntimeError):
    pass


async def _launch(profile: Path) -> tuple[asyncio.subprocess.Process, int, str]:
    """Start Chromium and wait for its DevTools port. A launch that exits or hangs
    (seen once on a loaded CI machine) raises with the tail of Chromium's own stderr."""
    stderr_path = profile / "chromium-stderr.log"
    with stderr_path.open("wb") as stderr:
        # Own process group: Chromium's helper processes go down with it.
        process = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    port_file = profile / "DevToolsActivePort"
    try:
        async with asyncio.timeout(LAUNCH_SECONDS):
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if process.returncode is not None:
                    break
                await asyncio.sleep(0.05)
    except TimeoutError:
        pass
    if not (port_file.exists() and port_file.read_text().count("\n") >= 1):
        await _kill(process)
        tail = stderr_path.read_text(errors="replace")[-2000:]
        raise ChromiumDidNotStart(
            f"Chromium exited {process.returncode} without a DevTools port within {LAUNCH_SECONDS} s:\n{tail}"
        )
    port_line, browser_path = port_file.read_text().splitlines()[:2]
    return process, int(port_line), browser_path


async def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


@contextlib.asynccontextmanager
async def chromium_page() -> AsyncIterator[Page]:
    require_slow_tier("starts Chromium")
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    profile = Path(tempfile.mkdtemp(prefix="mlpa-chromium-"))
    process = None
    try:
        for attempt in range(1, LAUNCH_ATTEMPTS + 1):
            try:
                process, port, browser_path = await _launch(profile)
                break
            except ChromiumDidNotStart:
                if attempt == LAUNCH_ATTEMPTS:
                    raise
                shutil.rmtree(profile, ignore_errors=True)
                profile.mkdir()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            target = next(t for t in targets if t["type"] == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Network.enable")
                yield page
            # A clean exit lets Chromium remove its own temporary files.
            async with session.ws_connect(f"ws://127.0.0.1:{port}{browser_path}") as browser:
                await browser.send_json({"id": 1, "method": "Browser.close"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 5)
    finally:
        if process is not None:
            await _kill(process)
        shutil.rmtree(profile, ignore_errors=True)
