"""The fake LiteLLM records spend and joins budgets as LiteLLM does: each successful
completion of an end user (`user` in the body) adds its cost (usage x price, or the
reported cost) to that user's `spend`, and `/customer/info` carries the user's budget row as
`litellm_budget_table`; over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from mlpa_aiohttp.testing.fake_litellm import DEFAULT_PRICES, FakeLiteLLM, MemoryCustomerTable

MASTER = {"Authorization": "Bearer sk-test-master"}
VIRTUAL = {"Authorization": "Bearer sk-test-virtual"}
USER = "spender:ai"
BUDGET = "end-user-budget-ai"


@pytest.fixture
def fake() -> FakeLiteLLM:
    customers = MemoryCustomerTable()
    customers.add_budget(BUDGET, max_budget=0.1, budget_duration="1d", tpm_limit=2000, rpm_limit=40)
    return FakeLiteLLM(chunks=4, prompt_tokens=9, customer_table=customers)


@pytest.fixture
async def server(fake: FakeLiteLLM, aiohttp_server) -> TestServer:
    return await aiohttp_server(fake.make_app())


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def create(session: aiohttp.ClientSession, server: TestServer, budget_id: str | None = BUDGET) -> None:
    async with session.post(
        server.make_url("/customer/new"), json={"user_id": USER, "budget_id": budget_id}, headers=MASTER
    ) as response:
        assert response.status == 200


async def complete(session: aiohttp.ClientSession, server: TestServer, *, stream: bool, **extra: Any) -> bytes:
    body = {"model": "gpt-oss-120b", "stream": stream, "messages": [{"role": "user", "content": "Hi"}], **extra}
    async with session.post(server.make_url("/v1/chat/completions"), json=body, headers=VIRTUAL) as response:
        assert response.status == 200
        return await response.read()


async def info(session: aiohttp.ClientSession, server: TestServer) -> dict[str, Any]:
    async with session.get(server.make_url("/customer/info"), params={"end_user_id": USER}, headers=MASTER) as response:
        assert response.status == 200
        return await response.json()


def priced(prompt_tokens: int, completion_tokens: int) -> float:
    prompt_price, completion_price = DEFAULT_PRICES
    return prompt_tokens * prompt_price + completion_tokens * completion_price


def test_the_default_price_makes_the_default_completion_cost_the_default_header() -> None:
    fake = FakeLiteLLM()
    assert fake.completion_cost(fake.prompt_tokens, fake.chunks) == pytest.approx(
        float(fake.response_headers["x-litellm-response-cost"])
    )


async def test_each_completion_adds_its_cost_to_the_end_users_spend(
    fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession
) -> None:
    await create(session, server)
    assert (await info(session, server))["spend"] == 0.0
    await complete(session, server, stream=False, user=USER)
    assert (await info(session, server))["spend"] == pytest.approx(priced(9, 4))
    raw = await complete(session, server, stream=True, user=USER)
    assert raw.endswith(b"data: [DONE]\n\n")
    assert (await info(session, server))["spend"] == pytest.approx(2 * priced(9, 4))
    # No end user named, or an unpriced model: nothing is charged.
    await complete(session, server, stream=False)
    fake.prices = None
    await complete(session, server, stream=True, user=USER)
    assert (await info(session, server))["spend"] == pytest.approx(2 * priced(9, 4))
    # A reported cost (a priced model's usage.cost) is what is charged.
    fake.usage_cost = 0.5
    await complete(session, server, stream=False, user=USER)
    assert (await info(session, server))["spend"] == pytest.approx(0.5 + 2 * priced(9, 4))


async def test_a_failed_completion_costs_nothing(fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession) -> None:
    await create(session, server)
    body = {"model": "gpt-oss-120b", "user": USER, "messages": [{"role": "user", "content": "Hi [fake:server_500]"}]}
    async with session.post(server.make_url("/v1/chat/completions"), json=body, headers=VIRTUAL) as response:
        assert response.status == 500
    assert (await info(session, server))["spend"] == 0.0


async def test_customer_info_joins_the_budget_row(fake: FakeLiteLLM, server: TestServer, session: aiohttp.ClientSession) -> None:
    await create(session, server)
    row = await info(session, server)
    assert row["budget_id"] == BUDGET
    budget = row["litellm_budget_table"]
    assert budget["budget_id"] == BUDGET and budget["max_budget"] == 0.1 and budget["budget_duration"] == "1d"
    assert budget["tpm_limit"] == 2000 and budget["rpm_limit"] == 40 and budget["budget_reset_at"] is None


async def test_a_user_without_a_known_budget_has_no_budget_row(server: TestServer, session: aiohttp.ClientSession) -> None:
    await create(session, server, budget_id="no-such-budget")
    assert (await info(session, server))["litellm_budget_table"] is None


async def test_the_spend_sink_receives_each_charge_beside_the_table(aiohttp_server, session: aiohttp.ClientSession) -> None:
    charged: list[tuple[str, float]] = []

    async def spend_sink(user_id: str, cost: float) -> None:
        charged.append((user_id, cost))

    fake = FakeLiteLLM(chunks=2, prompt_tokens=3, spend_sink=spend_sink)
    server = await aiohttp_server(fake.make_app())
    await create(session, server)
    await complete(session, server, stream=True, user=USER)
    assert charged == [(USER, pytest.approx(priced(3, 2)))]
    assert (await info(session, server))["spend"] == pytest.approx(priced(3, 2))
