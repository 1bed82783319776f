"""The stack's fake LiteLLM on PostgreSQL: a completion's cost lands in LiteLLM's end-user
table and `/customer/info` joins the budget row the service wrote, so LiteLLM's view and the
store's (`/v1/usage` reads it) agree; over real HTTP and a real PostgreSQL server."""

from __future__ import annotations

import aiohttp
import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, ServiceType
from mlpa_aiohttp.store.postgres import PostgresUserStore
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from mlpa_aiohttp.testing.litellm_schema import EndUserTable

pytestmark = pytest.mark.postgres

MASTER = {"Authorization": "Bearer sk-test-master"}
VIRTUAL = {"Authorization": "Bearer sk-test-virtual"}
USER = "stacked:ai"


async def test_spend_and_budget_agree_between_the_fake_and_litellms_tables(
    pg_store: PostgresUserStore, litellm_table: EndUserTable, aiohttp_server
) -> None:
    await pg_store.ensure_budgets(BUILTIN_CATALOG.budgets)  # what the service does at start
    tier = BUILTIN_CATALOG.budgets[ServiceType.AI]
    fake = FakeLiteLLM(customer_table=litellm_table, chunks=6)
    server = await aiohttp_server(fake.make_app())
    async with aiohttp.ClientSession() as session:
        async with session.post(
            server.make_url("/customer/new"), json={"user_id": USER, "budget_id": tier.budget_id}, headers=MASTER
        ) as response:
            assert response.status == 200
        body = {"model": "m", "user": USER, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
        async with session.post(server.make_url("/v1/chat/completions"), json=body, headers=VIRTUAL) as response:
            assert response.status == 200
            await response.read()
        async with session.get(
            server.make_url("/customer/info"), params={"end_user_id": USER}, headers=MASTER
        ) as response:
            litellm_view = await response.json()
    usage = await pg_store.get_usage(USER)
    assert usage is not None
    expected = fake.completion_cost(fake.prompt_tokens, 6)
    assert expected > 0
    assert litellm_view["spend"] == pytest.approx(expected) and usage.spend == pytest.approx(expected)
    budget = litellm_view["litellm_budget_table"]
    assert budget["budget_id"] == usage.budget_id == tier.budget_id
    assert budget["max_budget"] == usage.max_budget == tier.max_budget
    assert budget["rpm_limit"] == usage.rpm_limit and budget["tpm_limit"] == usage.tpm_limit
    assert budget["budget_duration"] == usage.budget_duration == tier.budget_duration
