"""GET /v1/usage over real HTTP: the caller's own spend and limits, authenticated exactly as
chat, and nobody else's."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from mlpa_aiohttp import keys
from mlpa_aiohttp.auth.access_token import issue_access_token
from mlpa_aiohttp.catalog import BUILTIN_CATALOG, ServiceType
from mlpa_aiohttp.store.memory import MemoryUserStore
from tests.support.app_attest_device import TestAttestationCA

from tests.support.store_seeding import seed_user, set_memory_budget_reset, set_memory_spend

from ..conftest import DEV_TOKEN, Service, chat_body
from tests.support.device_service import attested_device, ca, challenge_for, google  # noqa: F401 (fixtures the device service needs)
from tests.support.device_service import device_service  # noqa: F401 (fixture)

AI = BUILTIN_CATALOG.budgets[ServiceType.AI]


def memory_store(service: Service) -> MemoryUserStore:
    store = service.app[keys.STORE]
    assert isinstance(store, MemoryUserStore)
    return store


async def provisioned(service: Service, token: str, service_type: str = "ai") -> None:
    """A user as a first chat request creates it."""
    response = await service.chat(chat_body(), headers=service.headers(authorization=f"Bearer {token}", service_type=service_type))
    assert response.status == 200


async def get_usage(service: Service, token: str, *, params: dict[str, str] | None = None, **headers: str):
    merged = service.headers(authorization=f"Bearer {token}", **headers)
    return await service.client.get("/v1/usage", headers=merged, params=params)


async def test_each_user_sees_only_their_own_usage(service: Service) -> None:
    alice, bob = service.fxa.issue_jwt("alice"), service.fxa.issue_jwt("bob")
    await provisioned(service, alice)
    await provisioned(service, bob)
    store = memory_store(service)
    set_memory_spend(store, "alice:ai", 0.03)
    set_memory_spend(store, "bob:ai", 0.25)
    reset = datetime(2026, 12, 1, tzinfo=timezone.utc)
    set_memory_budget_reset(store, AI.budget_id, reset)

    response = await get_usage(service, alice)
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert await response.json() == {
        "service_type": "ai",
        "spend": 0.03,
        "max_budget": AI.max_budget,
        "remaining_budget": pytest.approx(AI.max_budget - 0.03),
        "budget_duration": AI.budget_duration,
        "budget_reset_at": "2026-12-01T00:00:00+00:00",
        "tpm_limit": AI.tpm_limit,
        "rpm_limit": AI.rpm_limit,
    }
    bobs = await (await get_usage(service, bob)).json()
    assert bobs["spend"] == 0.25 and bobs["remaining_budget"] == 0.0  # over budget: nothing left, never negative


@pytest.mark.parametrize(
    ("params", "headers"),
    [
        ({"user_id": "bob:ai"}, {}),
        ({"user": "bob:ai", "end_user_id": "bob:ai", "uid": "bob"}, {}),
        ({}, {"x-user-id": "bob:ai", "user": "bob:ai", "end-user-id": "bob:ai"}),
    ],
)
async def test_naming_another_user_has_no_effect(service: Service, params: dict, headers: dict) -> None:
    alice, bob = service.fxa.issue_jwt("alice"), service.fxa.issue_jwt("bob")
    await provisioned(service, alice)
    await provisioned(service, bob)
    set_memory_spend(memory_store(service), "bob:ai", 0.5)
    response = await get_usage(service, alice, params=params, **headers)
    assert response.status == 200
    assert (await response.json())["spend"] == 0.0


async def test_each_service_type_is_its_own_user_and_tier(service: Service) -> None:
    token = service.fxa.issue_jwt("alice")
    await provisioned(service, token, "memories")
    body = await (await get_usage(service, token, service_type="memories")).json()
    memories = BUILTIN_CATALOG.budgets[ServiceType.MEMORIES]
    assert (body["service_type"], body["rpm_limit"], body["budget_reset_at"]) == ("memories", memories.rpm_limit, None)
    # No ai user yet for the same uid.
    assert (await get_usage(service, token, service_type="ai")).status == 404


async def test_an_unknown_user_is_404_and_nothing_is_created(service: Service) -> None:
    response = await get_usage(service, service.fxa.issue_jwt("newcomer"))
    assert (response.status, await response.json()) == (404, {"detail": "User not found"})
    assert service.litellm.requests_to("/customer/new") == []
    assert await memory_store(service).get_user("newcomer:ai") is None


async def test_a_blocked_user_is_403_as_on_chat(service: Service) -> None:
    await seed_user(memory_store(service), "blocked-uid:ai", AI.budget_id, blocked=True)
    response = await get_usage(service, service.fxa.issue_jwt("blocked-uid"))
    assert (response.status, await response.json()) == (403, {"detail": {"error": "User is blocked."}})


async def test_authentication_and_service_type_rules_are_chats(service: Service) -> None:
    token = service.fxa.issue_jwt("alice")
    no_auth = await service.client.get("/v1/usage", headers={"service-type": "ai"})
    assert no_auth.status == 422
    assert (await no_auth.json())["detail"][0]["loc"] == ["header", "authorization"]
    no_type = await service.client.get("/v1/usage", headers={"authorization": f"Bearer {token}"})
    assert (await no_type.json())["detail"][0]["loc"] == ["header", "service-type"]
    bad_type = await get_usage(service, token, service_type="nope")
    assert bad_type.status == 422
    bad_token = await get_usage(service, "not-a-token")
    assert (bad_token.status, await bad_token.json()) == (401, {"detail": "Invalid FxA auth"})
    bad_purpose = await get_usage(service, token, purpose="memory-generation")
    assert bad_purpose.status == 400
    # Dev tiers need the experimentation token, as on chat.
    no_dev_key = await get_usage(service, token, service_type="ai-dev")
    assert no_dev_key.status == 401
    await seed_user(memory_store(service), "alice:ai-dev", BUILTIN_CATALOG.budgets[ServiceType.AI_DEV].budget_id)
    with_dev_key = await get_usage(service, token, service_type="ai-dev", x_dev_authorization=DEV_TOKEN)
    assert with_dev_key.status == 200
    assert (await with_dev_key.json())["rpm_limit"] == BUILTIN_CATALOG.budgets[ServiceType.AI_DEV].rpm_limit


async def test_usage_with_an_app_attest_assertion_over_the_empty_body(
    device_service: Service, ca: TestAttestationCA  # noqa: F811
) -> None:
    device = await attested_device(device_service, ca)
    await seed_user(memory_store(device_service), f"{device.key_id_b64}:ai", AI.budget_id)
    challenge = await challenge_for(device_service, device.key_id_b64)
    headers = {
        "authorization": f"Bearer {device.assertion_jwt(challenge, b'', 1)}",
        "service-type": "ai",
        "use-app-attest": "true",
    }
    response = await device_service.client.get("/v1/usage", headers=headers)
    assert response.status == 200, await response.text()
    assert (await response.json())["max_budget"] == AI.max_budget


async def test_usage_with_a_play_integrity_access_token(service: Service) -> None:
    secret = service.app[keys.SETTINGS].auth.access_token_secret
    token = issue_access_token(secret, "android-user", 3600, time.time())
    await seed_user(memory_store(service), "android-user:s2s-android", BUILTIN_CATALOG.budgets[ServiceType.S2S_ANDROID].budget_id)
    headers = {"authorization": f"Bearer {token}", "service-type": "s2s-android", "use-play-integrity": "1"}
    response = await service.client.get("/v1/usage", headers=headers)
    assert response.status == 200, await response.text()
    assert (await response.json())["service_type"] == "s2s-android"
