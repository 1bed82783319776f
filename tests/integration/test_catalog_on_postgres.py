"""A service type that the built-in catalogue does not have, from a catalogue file alone:
over real HTTP, on real PostgreSQL (its LiteLLM budget row), in the OpenAPI document and
the metrics. And a changed tier: LiteLLM's budget row follows, and so do existing users."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Awaitable, Callable

import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, BudgetTier, Catalog, ModelEntry, ServiceTypeEntry
from mlpa_aiohttp.catalog.file import render_catalog
from mlpa_aiohttp.store.pools import Pools

from ..conftest import Service, chat_body
from .conftest import PgServiceFactory

pytestmark = pytest.mark.postgres

# The iOS quick answers of a pilot: a type, its purpose, its tier and its own model.
BRIEF = ServiceTypeEntry(
    "brief-answer",
    ("quick-answer", "follow-up"),
    BudgetTier("end-user-budget-brief-answer", 0.25, 12, 3000, "1d"),
    capped=True,
)
WITH_BRIEF = Catalog(
    (*BUILTIN_CATALOG.service_types, BRIEF),
    BUILTIN_CATALOG.search_types,
    (*BUILTIN_CATALOG.models, ModelEntry("brief", pinned_to=("brief-answer",))),
)

ServiceOnFile = Callable[[Catalog], Awaitable[Service]]


@pytest.fixture
def service_on_file(make_pg_service: PgServiceFactory, tmp_path: Path) -> ServiceOnFile:
    async def start(catalog: Catalog) -> Service:
        path = tmp_path / f"catalog-{len(list(tmp_path.iterdir()))}.toml"
        path.write_text(render_catalog(catalog))
        return await make_pg_service(
            token_uid="ios-uid", MLPA_CATALOG_FILE=str(path), MLPA_ENFORCE_SIGNIN_CAP="true", MLPA_MAX_SIGNED_IN_USERS="1"
        )

    return start


async def test_a_new_service_type_works_end_to_end_from_the_file_alone(service_on_file: ServiceOnFile, pools: Pools) -> None:
    service = await service_on_file(WITH_BRIEF)
    tier = await pools.litellm.fetchrow(
        'SELECT max_budget, rpm_limit, tpm_limit, budget_duration FROM "LiteLLM_BudgetTable" WHERE budget_id = $1',
        "end-user-budget-brief-answer",
    )
    assert tier is not None and tuple(tier) == (0.25, 12, 3000, "1d")
    assert await pools.litellm.fetchval('SELECT count(*) FROM "LiteLLM_BudgetTable"') == 16

    brief = service.headers(service_type="brief-answer", purpose="quick-answer")
    response = await service.chat(chat_body(stream=True, model="brief"), headers=brief)
    assert response.status == 200
    assert (await response.read()).endswith(b"data: [DONE]\n\n")
    sent = [r for r in service.litellm.requests if r.path == "/v1/chat/completions"][-1]
    assert (sent.json["user"], sent.json["model"]) == ("ios-uid:brief-answer", "brief")
    row = await pools.litellm.fetchrow('SELECT budget_id FROM "LiteLLM_EndUserTable" WHERE user_id = $1', "ios-uid:brief-answer")
    assert row is not None and row["budget_id"] == "end-user-budget-brief-answer"
    # The file made it capped: the one slot is this identity's.
    assert await pools.app.fetchval("SELECT current_identities FROM mlpa_user_capacity WHERE id = 1") == 1

    usage = await service.client.get("/v1/usage", headers=brief)
    assert (await usage.json())["rpm_limit"] == 12 and (await usage.json())["max_budget"] == 0.25

    # Its pinning and its purposes are the file's.
    other_model = await service.chat(chat_body(model="gpt-oss-120b"), headers=brief)
    assert (other_model.status, await other_model.json()) == (
        400,
        {"detail": "Invalid service-type value brief-answer for model gpt-oss-120b. "
         "Service type brief-answer is only valid for models ['brief']"},
    )
    wrong_type = await service.chat(chat_body(model="brief"))
    assert (await wrong_type.json()) == {"detail": "Invalid service-type value for model brief. Should be one of ['brief-answer']"}
    wrong_purpose = await service.chat(chat_body(model="brief"), headers={**brief, "purpose": "chat"})
    assert (wrong_purpose.status, await wrong_purpose.json()) == (
        400,
        {"detail": "Invalid header 'purpose' for service-type 'brief-answer'. Valid values: quick-answer, follow-up"},
    )
    unknown = await service.chat(headers=service.headers(service_type="deep-answer"))
    assert unknown.status == 422
    assert (await unknown.json())["detail"][0]["msg"].endswith("'search-dev' or 'brief-answer'")

    document = await (await service.client.get("/openapi.json")).json()
    (header,) = [p for p in document["paths"]["/v1/chat/completions"]["post"]["parameters"] if p["name"] == "service-type"]
    assert header["schema"]["enum"][-1] == "brief-answer"
    (purpose,) = [p for p in document["paths"]["/v1/chat/completions"]["post"]["parameters"] if p["name"] == "purpose"]
    assert {"quick-answer", "follow-up"} <= set(purpose["schema"]["enum"])

    exposition = await (await service.client.get("/metrics")).text()
    assert (
        'mlpa_requests_total{endpoint="/v1/chat/completions",major_fx_version="",method="POST",'
        'purpose="quick-answer",service_type="brief-answer",traffic_contract_rpm_mode="N/A",traffic_contract_tpm_mode="N/A"}'
    ) in exposition
    assert 'mlpa_chat_availability_total{model="brief",outcome="success",purpose="quick-answer",reason="valid_response",service_type="brief-answer"} 1.0' in exposition
    # A type the file does not have stays bounded.
    assert 'service_type="deep-answer"' not in exposition and 'service_type="other"' in exposition


async def test_a_changed_tier_updates_litellms_row_and_existing_users_get_it(
    service_on_file: ServiceOnFile, pools: Pools
) -> None:
    service = await service_on_file(BUILTIN_CATALOG)
    assert (await service.chat()).status == 200
    before = await (await service.client.get("/v1/usage", headers=service.headers())).json()
    assert (before["max_budget"], before["rpm_limit"], before["budget_duration"]) == (0.1, 40, "1d")

    ai = BUILTIN_CATALOG.entry("ai")
    raised = replace(ai, budget=replace(ai.budget, max_budget=0.5, rpm_limit=60, tpm_limit=4000, budget_duration="7d"))
    changed = Catalog(
        tuple(raised if st.name == "ai" else st for st in BUILTIN_CATALOG.service_types),
        BUILTIN_CATALOG.search_types,
        BUILTIN_CATALOG.models,
    )
    restarted = await service_on_file(changed)  # a new start (a new pod or gunicorn worker)
    row = await pools.litellm.fetchrow(
        'SELECT max_budget, rpm_limit, tpm_limit, budget_duration FROM "LiteLLM_BudgetTable" WHERE budget_id = $1',
        "end-user-budget-ai",
    )
    assert tuple(row) == (0.5, 60, 4000, "7d")
    # The end user was not touched: its budget_id names the row, so it reads the new limits.
    user = await pools.litellm.fetchrow('SELECT budget_id FROM "LiteLLM_EndUserTable" WHERE user_id = $1', "ios-uid:ai")
    assert user["budget_id"] == "end-user-budget-ai"
    after = await (await restarted.client.get("/v1/usage", headers=restarted.headers())).json()
    assert (after["max_budget"], after["rpm_limit"], after["tpm_limit"], after["budget_duration"]) == (0.5, 60, 4000, "7d")
