"""Headless Chromium for page tests, driven over the DevTools protocol.

`chromium_page()` starts a fresh browser with its own profile and yields a `Page`; tests
skip (one line, with the fix) where no Chromium is installed.
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


@contextlib.asynccontextmanager
async def chromium_page() -> AsyncIterator[Page]:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    profile = tempfile.mkdtemp(prefix="mlpa-chromium-")
    # Own process group: Chromium's helper processes go down with it.
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        async with asyncio.timeout(20):
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                await asyncio.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            target = next(t for t in targets if t["type"] == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Network.enable")
                yield page
            # A clean exit lets Chromium remove its own temporary files.
            async with session.ws_connect(f"ws://127.0.0.1:{port}{port_file.read_text().splitlines()[1]}") as browser:
                await browser.send_json({"id": 1, "method": "Browser.close"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        shutil.rmtree(profile, ignore_errors=True)
