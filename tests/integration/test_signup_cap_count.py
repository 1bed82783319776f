"""When `/user/signup-cap-status` has the current count of managed identities, and that its
body says so: with the cap enforced every new identity is counted as it is admitted; without,
no admission runs and the count is the one the last process start reconciled from LiteLLM's
table. Real PostgreSQL, the fake LiteLLM writing its end users there, the app over HTTP."""

from __future__ import annotations

from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.catalog import ServiceType
from mlpa_aiohttp.routes.admin import COUNTED_AT_ADMISSION, COUNTED_AT_START_UP
from mlpa_aiohttp.settings import AuthSettings, PostgresSettings, Settings, SignupCapSettings, UpstreamSettings
from mlpa_aiohttp.store.pools import Pools
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from mlpa_aiohttp.testing.litellm_schema import EndUserTable

pytestmark = pytest.mark.postgres

UI = {"mlpa_ui_access_key": "Bearer sk-ui-test"}


@pytest.fixture
async def litellm(litellm_table: EndUserTable, aiohttp_server) -> tuple[FakeLiteLLM, TestServer]:
    fake = FakeLiteLLM(master_key="sk-master-test", customer_table=litellm_table)
    return fake, await aiohttp_server(fake.make_app())


def settings(api_base: str, pg: PostgresSettings, *, enforce: bool) -> Settings:
    return Settings(
        upstream=UpstreamSettings(api_base=api_base, master_key="sk-master-test"),
        auth=AuthSettings(ui_access_key="sk-ui-test"),
        signup_cap=SignupCapSettings(
            enforce=enforce, max_signed_in_users=10, capped_service_types=frozenset({ServiceType.AI})
        ),
        store="postgres",
        postgres=pg,
    )


@pytest.mark.parametrize("enforce", [True, False])
async def test_the_status_says_when_its_count_is_current(
    enforce: bool, litellm: tuple[FakeLiteLLM, TestServer], pg_settings: PostgresSettings, aiohttp_client
) -> None:
    _, server = litellm
    api_base = str(server.make_url("")).rstrip("/")
    client = await aiohttp_client(create_app(settings(api_base, pg_settings, enforce=enforce)))

    async def status(of=client) -> dict:
        async with of.get("/user/signup-cap-status", headers=UI) as response:
            assert response.status == 200
            return await response.json()

    before = await status()
    assert before["current_managed_identities"] == 0
    assert before["managed_identities_counted"] == (COUNTED_AT_ADMISSION if enforce else COUNTED_AT_START_UP)
    await client.app[keys.PROVISIONER].provision("newcomer:ai")  # a capped user is created
    after = await status()
    if enforce:
        assert after["current_managed_identities"] == 1
    else:
        # Not counted until a process starts and reconciles LiteLLM's table, as the body says.
        assert after["current_managed_identities"] == 0
        restarted = await aiohttp_client(create_app(settings(api_base, pg_settings, enforce=False)))
        assert (await status(restarted))["current_managed_identities"] == 1
