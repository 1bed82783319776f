"""The admin page in a real headless Chromium, driven over the DevTools protocol.

The page is served by the admin routes over a real socket, backed by the Postgres store
seeded with known users; the test types the key, submits, and reads the rendered DOM.
Skipped (with the reason) only when no Chromium is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mlpa_aiohttp.catalog import ServiceType
from mlpa_aiohttp.store.pools import Pools
from mlpa_aiohttp.store.postgres import PostgresUserStore

from .conftest import insert_user
from .test_admin_routes import UI_KEY, admin_app, admin_settings

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")) if p), None
)
if CHROMIUM is None:
    # One line for the module, decided before any fixture (PostgreSQL included) starts.
    pytest.skip("Chromium is not installed (Debian: apt-get install chromium); CI installs it", allow_module_level=True)

pytestmark = pytest.mark.postgres
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
)
CAPPED = frozenset({ServiceType.AI, ServiceType.MEMORIES})
ServerFactory = Callable[..., Awaitable[TestServer]]


class Page:
    """Just enough of the DevTools protocol: navigate, evaluate, wait for a condition."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        await self._ws.send_json({"id": message_id, "method": method, "params": params})
        async for message in self._ws:
            data = json.loads(message.data)
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

    async def wait_for(self, expression: str, timeout: float = 10.0) -> Any:
        async with asyncio.timeout(timeout):
            while not (value := await self.evaluate(expression)):
                await asyncio.sleep(0.05)
        return value

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete' && !!document.getElementById('key-form')")

    async def submit_key(self, key: str) -> str:
        await self.evaluate("delete document.body.dataset.state")
        await self.evaluate(
            f"document.getElementById('key-input').value = {json.dumps(key)};"
            "document.getElementById('key-form').requestSubmit();"
        )
        return str(await self.wait_for("document.body.dataset.state"))


RENDERED = """(() => {
  const text = (id) => document.getElementById(id).textContent.trim();
  const hidden = (id) => document.getElementById(id).hidden;
  return {
    error: hidden('error') ? null : text('error'),
    total: hidden('users-card') ? null : text('total-users'),
    rows: [...document.querySelectorAll('#service-types .bar-row')].map((row) => ({
      type: row.dataset.serviceType,
      count: row.querySelector('.count').textContent,
      share: row.querySelector('.share').textContent,
    })),
    capacity: hidden('capacity-card') ? null : {
      current: text('capacity-current'),
      utilisation: text('capacity-utilisation'),
      slots: text('capacity-slots'),
      updated: text('capacity-updated'),
      missing: document.getElementById('capacity-card').classList.contains('missing'),
      missingNoteShown: !hidden('capacity-missing'),
    },
    keyInStorage: localStorage.length + sessionStorage.length + document.cookie.length,
  };
})()"""


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    assert CHROMIUM is not None
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
                yield Page(ws)
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


async def serve(store: Any, aiohttp_server: ServerFactory, *, enforce: bool = True) -> str:
    server = await aiohttp_server(admin_app(store, admin_settings("http://127.0.0.1:1", enforce=enforce)))
    return str(server.make_url("/admin"))


async def test_page_renders_the_real_numbers(
    page: Page, pg_store: PostgresUserStore, pools: Pools, aiohttp_server: ServerFactory
) -> None:
    for user_id in ("a:ai", "b:ai", "c:ai", "a:memories", "d:s2s"):
        await insert_user(pools.litellm, user_id)
    await pg_store.ensure_capacity_state(10, CAPPED)
    await page.open(await serve(pg_store, aiohttp_server))

    assert await page.submit_key("wrong-key") == "error"
    rendered = await page.evaluate(RENDERED)
    assert rendered["error"] == "Invalid UI access key"
    assert rendered["total"] is None and rendered["capacity"] is None

    assert await page.submit_key(UI_KEY) == "loaded"
    rendered = await page.evaluate(RENDERED)
    assert rendered["error"] is None
    assert rendered["total"] == "5"
    assert rendered["rows"] == [
        {"type": "ai", "count": "3", "share": "60.0%"},
        {"type": "memories", "count": "1", "share": "20.0%"},
        {"type": "s2s", "count": "1", "share": "20.0%"},
    ]
    capacity = rendered["capacity"]
    assert capacity["current"] == "3 / 10"
    assert capacity["utilisation"] == "30.0%"
    assert capacity["slots"] == "7"
    assert capacity["updated"] not in ("", "—")
    assert capacity["missing"] is False and capacity["missingNoteShown"] is False
    assert rendered["keyInStorage"] == 0


async def test_page_flags_a_missing_capacity_row_and_hides_the_card_when_not_enforced(
    page: Page, pg_store: PostgresUserStore, aiohttp_server: ServerFactory
) -> None:
    await page.open(await serve(pg_store, aiohttp_server))
    assert await page.submit_key(UI_KEY) == "loaded"
    rendered = await page.evaluate(RENDERED)
    assert rendered["total"] == "0" and rendered["rows"] == []
    capacity = rendered["capacity"]
    assert capacity["missing"] is True and capacity["missingNoteShown"] is True
    assert capacity["current"] == "— / 500" and capacity["slots"] == "—"

    await page.open(await serve(pg_store, aiohttp_server, enforce=False))
    assert await page.submit_key(UI_KEY) == "loaded"
    assert (await page.evaluate(RENDERED))["capacity"] is None
