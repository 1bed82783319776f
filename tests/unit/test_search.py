"""`POST /v1/search` (compatibility.md §1.9, §4.8)."""

from __future__ import annotations

import pytest

from mlpa_aiohttp import keys

from tests.support.store_seeding import seed_user

from ..conftest import Service


async def search(service: Service, body: dict, **headers: str):
    merged = {"authorization": f"Bearer {service.token}", **headers}
    return await service.client.post("/v1/search", json=body, headers=merged)


async def test_search_defaults_to_search_service_type(service: Service) -> None:
    response = await search(service, {"query": "firefox", "max_results": 3})
    assert response.status == 200
    assert len((await response.json())["results"]) == 3
    sent = service.litellm.requests_to("/v1/search/exa-search")[-1].json
    # MLPA 1.0.39 §A.7: only these three (no service type, purpose or metadata).
    assert sent == {"query": "firefox", "max_results": 3, "user": "test-uid:search"}
    registry = service.app[keys.METRICS].registry
    assert registry.get_sample_value("mlpa_search_latency_seconds_count", {"result": "success"}) == 1


@pytest.mark.parametrize(
    "body,loc",
    [({"query": "q"}, ["body", "max_results"]), ({"query": "q", "max_results": 11}, ["body", "max_results"]),
     ({"max_results": 1}, ["body", "query"]), ({"query": "q", "max_results": 0}, ["body", "max_results"])],
)
async def test_search_validation(service: Service, body: dict, loc: list) -> None:
    response = await search(service, body)
    assert response.status == 422
    assert loc in [d["loc"] for d in (await response.json())["detail"]]


async def test_search_rejects_other_service_types_after_auth(service: Service) -> None:
    response = await search(service, {"query": "q", "max_results": 1}, **{"service-type": "ai"})
    assert response.status == 400
    assert await response.json() == {"detail": "service-type header must be one of ['search', 'search-dev', 'agent-search']"}
    unauthenticated = await search(service, {"query": "q", "max_results": 1}, **{"service-type": "ai", "authorization": "Bearer x"})
    assert unauthenticated.status == 401


async def test_search_classified_error(service: Service) -> None:
    service.litellm.next_scenarios.append("budget_429")
    response = await search(service, {"query": "q", "max_results": 1})
    assert response.status == 429 and await response.json() == {"detail": {"error": 1}}
    assert response.headers["Retry-After"] == "86400"
    registry = service.app[keys.METRICS].registry
    labels = {"reason": "budget_exceeded", "model": "exa-search", "service_type": "search", "purpose": ""}
    assert registry.get_sample_value("mlpa_search_request_rejections_total", labels) == 1


async def test_search_blocked_user(service: Service) -> None:
    await seed_user(service.app[keys.STORE], "test-uid:search", blocked=True)
    response = await search(service, {"query": "q", "max_results": 1})
    assert response.status == 403 and await response.json() == {"detail": {"error": "User is blocked."}}
