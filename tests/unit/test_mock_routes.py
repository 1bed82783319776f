"""`/mock/*` load-testing routes over real HTTP (compatibility.md §1.7, D16)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from mlpa_aiohttp import keys

from tests.support.metrics import registry, sample
from tests.support.store_seeding import seed_user

from ..conftest import Service, ServiceFactory, chat_body

MOCK_JSON = {
    "choices": [{"message": {"content": "mock completion response"}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    "model": "mock",
}
TTFT_MS = 120
CHUNK_MS = 80


def metric_families(service: Service, prefix: str) -> float:
    """Sum of every sample whose name starts with `prefix` (any labels)."""
    total = 0.0
    for family in registry(service).collect():
        for s in family.samples:
            if s.name.startswith(prefix) and not s.name.endswith("_created"):
                total += s.value
    return total


@pytest.fixture
async def mock_service(make_service: ServiceFactory) -> Service:
    return await make_service(
        MLPA_MOCK_ROUTES="true", MOCK_TTFT_MS=str(TTFT_MS), MOCK_STREAMING_CHUNK_LATENCY_MS=str(CHUNK_MS)
    )


async def post_mock(service: Service, path: str, body: dict[str, Any], headers: dict[str, str]):
    return await service.client.post(f"/mock/chat/{path}", data=json.dumps(body), headers=headers)


def sse_data(text: str) -> list[str]:
    return [event[len("data: ") :] for event in text.split("\n\n") if event.startswith("data: ")]


def assert_no_completion_metrics(service: Service) -> None:
    assert not service.litellm.requests_to("/v1/chat/completions"), "the mock route called LiteLLM"
    for prefix in (
        "mlpa_chat_completion_latency_seconds",
        "mlpa_chat_completion_ttft_seconds",
        "mlpa_chat_tokens",
        "mlpa_litellm_routed_completions",
        "mlpa_chat_availability",
    ):
        assert metric_families(service, prefix) == 0, prefix


# -- mounting -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["completions", "completions_no_auth"])
async def test_not_mounted_by_default(service: Service, path: str) -> None:
    response = await post_mock(service, path, chat_body(), service.headers())
    assert response.status == 404


@pytest.mark.parametrize("path", ["completions", "completions_no_auth"])
async def test_mounted_with_the_switch(mock_service: Service, path: str) -> None:
    response = await post_mock(mock_service, path, chat_body(), mock_service.headers())
    assert response.status == 200


# -- /mock/chat/completions -------------------------------------------------------------------


async def test_canned_completion_after_the_simulated_ttft(mock_service: Service) -> None:
    # That it waits MOCK_TTFT_MS first is tests/load/test_timing.py's check.
    response = await post_mock(mock_service, "completions", chat_body(), mock_service.headers())
    assert response.status == 200
    assert await response.json() == MOCK_JSON
    assert_no_completion_metrics(mock_service)


async def test_canned_stream_of_three_frames(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions", chat_body(stream=True), mock_service.headers())
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    events = sse_data(await response.text())
    assert [json.loads(e) for e in events[:2]] == [
        {"choices": [{"delta": {"content": "mock token 1"}}]},
        {"choices": [{"delta": {"content": "mock token 2"}}]},
    ]
    assert events[2] == "[DONE]"
    assert len(events) == 3
    assert_no_completion_metrics(mock_service)


async def test_provisions_the_litellm_user(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions", chat_body(), mock_service.headers(service_type="memories"))
    assert response.status == 200
    created = [r.json for r in mock_service.litellm.requests_to("/customer/new")]
    assert created == [{"user_id": "test-uid:memories", "budget_id": "end-user-budget-memories"}]


async def test_validation_as_on_the_chat_route(mock_service: Service) -> None:
    headers = mock_service.headers()
    del headers["service-type"]
    response = await post_mock(mock_service, "completions", chat_body(), headers)
    assert response.status == 422
    detail = (await response.json())["detail"]
    assert isinstance(detail, list) and detail[0]["loc"] == ["header", "service-type"]


async def test_model_name_rule_and_its_availability_sample(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions", chat_body(model="Bad Model"), mock_service.headers())
    assert response.status == 400
    assert await response.json() == {"detail": {"error": 8}}
    labels = {"outcome": "excluded", "reason": "invalid_model_name", "model": "invalid", "service_type": "ai", "purpose": ""}
    assert sample(mock_service, "mlpa_chat_availability_total", labels) == 1


async def test_model_pinning(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions", chat_body(model="exa"), mock_service.headers())
    assert response.status == 400
    assert await response.json() == {
        "detail": "Invalid service-type value for model exa. Should be one of ['answer', 'sw-answer']"
    }


async def test_auth_rejection_and_its_availability_sample(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions", chat_body(), mock_service.headers(authorization="Bearer nope"))
    assert response.status == 401
    assert await response.json() == {"detail": "Invalid FxA auth"}
    labels = {"outcome": "excluded", "reason": "auth_rejected", "model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(mock_service, "mlpa_chat_availability_total", labels) == 1
    assert not mock_service.litellm.requests_to("/customer/new")


async def test_dev_service_type_needs_the_dev_key(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions", chat_body(), mock_service.headers(service_type="ai-dev"))
    assert response.status == 401
    assert "x-dev-authorization required" in (await response.json())["detail"]


async def test_blocked_user_is_403_without_availability(mock_service: Service) -> None:
    await seed_user(mock_service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai", blocked=True)
    response = await post_mock(mock_service, "completions", chat_body(), mock_service.headers())
    assert response.status == 403
    assert await response.json() == {"detail": {"error": "User is blocked."}}
    assert metric_families(mock_service, "mlpa_chat_availability") == 0


async def test_signup_cap_applies(make_service: ServiceFactory) -> None:
    service = await make_service(
        MLPA_MOCK_ROUTES="true", MOCK_TTFT_MS="0", MLPA_ENFORCE_SIGNIN_CAP="true", MLPA_MAX_SIGNED_IN_USERS="1"
    )
    first = await post_mock(service, "completions", chat_body(), service.headers())
    assert first.status == 200
    second_user = service.fxa.issue_jwt("another-uid")
    second = await post_mock(service, "completions", chat_body(), service.headers(authorization=f"Bearer {second_user}"))
    assert second.status == 403
    assert await second.json() == {"detail": {"error": 4}}


async def test_client_leaving_mid_stream_leaves_nothing_behind(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions", chat_body(stream=True), mock_service.headers())
    first = await response.content.readany()
    assert b"mock token 1" in first
    response.close()
    await asyncio.sleep(CHUNK_MS / 1000 * 2)
    # The no_leaked_tasks fixture checks that the SSE ping task ended with the handler.


# -- /mock/chat/completions_no_auth ------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_no_auth_route_succeeds_with_a_service_typed_user(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), bearer(mock_service.token))
    assert response.status == 200
    assert await response.json() == MOCK_JSON
    created = [r.json["user_id"] for r in mock_service.litellm.requests_to("/customer/new")]
    assert created == ["test-uid:ai"]
    assert_no_completion_metrics(mock_service)


async def test_no_auth_route_streams(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions_no_auth", chat_body(stream=True), bearer(mock_service.token))
    events = sse_data(await response.text())
    assert len(events) == 3 and events[-1] == "[DONE]"


async def test_no_auth_route_takes_the_service_type_header(mock_service: Service) -> None:
    headers = {**bearer(mock_service.token), "service-type": "memories"}
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), headers)
    assert response.status == 200
    assert [r.json["user_id"] for r in mock_service.litellm.requests_to("/customer/new")] == ["test-uid:memories"]


async def test_no_auth_route_verifies_locally_against_the_cached_jwks(mock_service: Service) -> None:
    mock_service.fxa.reset_counters()
    for _ in range(3):
        response = await post_mock(mock_service, "completions_no_auth", chat_body(), bearer(mock_service.token))
        assert response.status == 200
    assert mock_service.fxa.jwks_fetches == 1
    assert mock_service.fxa.verify_calls == []


async def test_no_auth_route_needs_the_authorization_header(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), {})
    assert response.status == 422
    assert (await response.json())["detail"][0]["loc"] == ["header", "authorization"]


async def test_no_auth_route_validates_the_body(mock_service: Service) -> None:
    response = await post_mock(mock_service, "completions_no_auth", {"stream": "often"}, bearer(mock_service.token))
    assert response.status == 422
    locs = [error["loc"] for error in (await response.json())["detail"]]
    assert ["body", "stream"] in locs and ["body", "model"] in locs


async def test_no_auth_route_rejects_an_unknown_service_type(mock_service: Service) -> None:
    headers = {**bearer(mock_service.token), "service-type": "nope"}
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), headers)
    assert response.status == 422


@pytest.mark.parametrize("authorization", ["Bearer ", "Bearer", ""])
async def test_no_auth_route_empty_bearer(mock_service: Service, authorization: str) -> None:
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), {"authorization": authorization})
    assert response.status == 401
    assert await response.json() == {"detail": "Invalid authorization header format"}


async def test_no_auth_route_forged_signature(mock_service: Service) -> None:
    # Signed by a key FxA never published, but naming FxA's current key id.
    private_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = jwt.decode(mock_service.token, options={"verify_signature": False})
    forged = jwt.encode(
        claims, private_key, algorithm="RS256", headers={"kid": mock_service.fxa.current_kid, "typ": "at+jwt"}
    )
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), bearer(forged))
    assert response.status == 401
    assert await response.json() == {"detail": "Invalid token signature"}


async def test_no_auth_route_unpublished_key(mock_service: Service) -> None:
    kid = mock_service.fxa.new_key(publish=False)
    token = mock_service.fxa.issue_jwt("test-uid", kid=kid)
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), bearer(token))
    assert response.status == 401
    assert await response.json() == {"detail": "Invalid token signature"}


@pytest.mark.parametrize("kind", ["expired", "opaque", "wrong_typ", "no_scope"])
async def test_no_auth_route_other_jwt_failures_are_not_double_wrapped(mock_service: Service, kind: str) -> None:
    fxa = mock_service.fxa
    token = {
        "expired": lambda: fxa.issue_jwt("test-uid", expires_in=-60),
        "opaque": lambda: fxa.demo_token,
        "wrong_typ": lambda: fxa.issue_jwt("test-uid", typ="JWT"),
        "no_scope": lambda: fxa.issue_jwt("test-uid", scopes=("profile:email",)),
    }[kind]()
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), bearer(token))
    assert response.status == 401
    detail = (await response.json())["detail"]
    assert isinstance(detail, str) and detail.startswith("JWT verification failed: ")
    assert "401" not in detail and "Token verification failed" not in detail
    assert not mock_service.litellm.requests_to("/customer/new")


async def test_no_auth_route_blocked_user(mock_service: Service) -> None:
    await seed_user(mock_service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai", blocked=True)
    response = await post_mock(mock_service, "completions_no_auth", chat_body(), bearer(mock_service.token))
    assert response.status == 403
    assert await response.json() == {"detail": {"error": "User is blocked."}}
