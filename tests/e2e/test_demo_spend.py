"""The demo's LiteLLM keeps spend and budgets as LiteLLM does: after a completion with a cost,
`/user/<id>` (LiteLLM's end-user row with its budget) and `/v1/usage` (the caller's own view)
show the same spend and the same budget, in a real demo process."""

from __future__ import annotations

import os
import re

import aiohttp
import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, ServiceType
from mlpa_aiohttp.testing.fake_litellm import DEFAULT_PRICES
from tests.support.processes import running_demo

DEMO_CHUNKS = 20  # the demo's fake LiteLLM (`__main__._demo`)
DEMO_PROMPT_TOKENS = 7


async def test_spend_and_budget_agree_between_litellm_and_the_usage_route() -> None:
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    with running_demo(env) as (process, port):
        banner = []
        while not banner or "Ctrl-C" not in banner[-1]:
            line = process.stdout.readline()
            assert line, "".join(banner)
            banner.append(line)
        text = "".join(banner)
        token = re.search(r"FxA bearer token +(\S+)", text).group(1)
        master_key = re.search(r"MASTER_KEY \(fake LiteLLM, also the /user admin API key\) +(\S+)", text).group(1)
        base = f"http://127.0.0.1:{port}"
        caller = {"authorization": f"Bearer {token}", "service-type": "ai"}
        admin = {"master_key": f"Bearer {master_key}"}
        body = {"model": "gpt-oss-120b", "stream": True, "messages": [{"role": "user", "content": "Hello!"}]}
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.post(f"{base}/v1/chat/completions", json=body, headers=caller) as response:
                    assert response.status == 200
                    assert (await response.read()).endswith(b"data: [DONE]\n\n")
            async with session.get(f"{base}/user", headers=admin) as response:
                (user,) = (await response.json())["users"]
            async with session.get(f"{base}/user/{user['user_id']}", headers=admin) as response:
                assert response.status == 200
                litellm_view = await response.json()
            async with session.get(f"{base}/v1/usage", headers=caller) as response:
                assert response.status == 200
                usage = await response.json()

    prompt_price, completion_price = DEFAULT_PRICES
    expected_spend = 2 * (DEMO_PROMPT_TOKENS * prompt_price + DEMO_CHUNKS * completion_price)
    tier = BUILTIN_CATALOG.budgets[ServiceType.AI]
    assert user["user_id"].endswith(":ai")
    assert litellm_view["spend"] == pytest.approx(expected_spend)
    assert usage["spend"] == pytest.approx(litellm_view["spend"])
    budget = litellm_view["litellm_budget_table"]
    assert litellm_view["budget_id"] == budget["budget_id"] == tier.budget_id
    assert budget["max_budget"] == usage["max_budget"] == tier.max_budget
    assert budget["budget_duration"] == usage["budget_duration"] == tier.budget_duration
    assert budget["tpm_limit"] == usage["tpm_limit"] == tier.tpm_limit
    assert budget["rpm_limit"] == usage["rpm_limit"] == tier.rpm_limit
    assert usage["remaining_budget"] == pytest.approx(tier.max_budget - expected_spend)
