"""The admin page in a real headless Chromium, driven over the DevTools protocol.

The page is served by the service's own app (`create_app`) over a real socket, backed by
the Postgres store seeded with known users; the test types the key, submits, and reads the
rendered DOM. Skipped (with the reason) only when no Chromium is installed.
"""

from __future__ import annotations

import json
from typing import AsyncIterator

import pytest

from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.store.pools import Pools

from ..browser import CHROMIUM, Page, chromium_page
from .admin_service import CAPPED, UI_KEY, AdminService, ClientFactory, start_admin_service
from .conftest import insert_user

if CHROMIUM is None:
    # One line for the module, decided before any fixture (PostgreSQL included) starts.
    pytest.skip("Chromium is not installed (Debian: apt-get install chromium); CI installs it", allow_module_level=True)

pytestmark = pytest.mark.postgres


async def open_admin_page(page: Page, url: str) -> None:
    await page.call("Page.navigate", url=url)
    await page.wait_for("document.readyState === 'complete' && !!document.getElementById('key-form')")


async def submit_key(page: Page, key: str) -> str:
    """Types `key` into the page's form and returns the state the page settles in."""
    await page.evaluate("delete document.body.dataset.state")
    await page.evaluate(
        f"document.getElementById('key-input').value = {json.dumps(key)};"
        "document.getElementById('key-form').requestSubmit();"
    )
    return str(await page.wait_for("document.body.dataset.state"))


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
    async with chromium_page() as opened:
        yield opened


async def serve(
    pools: Pools, pg_settings: PostgresSettings, aiohttp_client: ClientFactory, *, enforce: bool = True
) -> AdminService:
    # LiteLLM is never called by the page's two requests: an unreachable address will do.
    return await start_admin_service(
        aiohttp_client, "http://127.0.0.1:1", pools=pools, pg_settings=pg_settings, enforce=enforce
    )


def admin_url(service: AdminService) -> str:
    return str(service.client.make_url("/admin"))


async def test_page_renders_the_real_numbers(
    page: Page, pools: Pools, pg_settings: PostgresSettings, aiohttp_client: ClientFactory
) -> None:
    for user_id in ("a:ai", "b:ai", "c:ai", "a:memories", "d:s2s"):
        await insert_user(pools.litellm, user_id)
    service = await serve(pools, pg_settings, aiohttp_client)  # startup counts a, b, c as capped
    await service.store.ensure_capacity_state(10, CAPPED)
    await open_admin_page(page, admin_url(service))

    assert await submit_key(page, "wrong-key") == "error"
    rendered = await page.evaluate(RENDERED)
    assert rendered["error"] == "Invalid UI access key"
    assert rendered["total"] is None and rendered["capacity"] is None

    assert await submit_key(page, UI_KEY) == "loaded"
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
    page: Page, pools: Pools, pg_settings: PostgresSettings, aiohttp_client: ClientFactory
) -> None:
    service = await serve(pools, pg_settings, aiohttp_client)
    await pools.app.execute("DELETE FROM mlpa_user_capacity")  # lost after startup seeded it
    await open_admin_page(page, admin_url(service))
    assert await submit_key(page, UI_KEY) == "loaded"
    rendered = await page.evaluate(RENDERED)
    assert rendered["total"] == "0" and rendered["rows"] == []
    capacity = rendered["capacity"]
    assert capacity["missing"] is True and capacity["missingNoteShown"] is True
    assert capacity["current"] == "— / 500" and capacity["slots"] == "—"

    await open_admin_page(page, admin_url(await serve(pools, pg_settings, aiohttp_client, enforce=False)))
    assert await submit_key(page, UI_KEY) == "loaded"
    assert (await page.evaluate(RENDERED))["capacity"] is None
