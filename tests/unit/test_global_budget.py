"""Error code 10, the global budget (MLPA 1.0.39 §A.5): LiteLLM says the user owning the shared
virtual key is over budget; the service answers 500 `{"detail": {"error": 10}}` with
`Retry-After: 300`, or the frame `data: {"error": 10}` in a stream, logs one WARNING and counts a
failure. Over real HTTP against the loopback fake LiteLLM."""

from __future__ import annotations

import pytest

from tests.support.metrics import sample

from ..conftest import Service, chat_body, events

CHAT = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}


def global_budget_samples(service: Service) -> tuple[float, float]:
    """(rejections, failure availability) of chat's global-budget reason."""
    rejections = sample(service, "mlpa_chat_request_rejections_total", {"reason": "global_budget_exceeded", **CHAT})
    availability = sample(
        service, "mlpa_chat_availability_total", {"outcome": "failure", "reason": "global_budget_exceeded", **CHAT}
    )
    return rejections, availability


@pytest.mark.parametrize("scenario", ["global_budget_400", "global_budget_422"])
async def test_non_streamed_chat_is_a_500_with_code_10(service: Service, caplog: pytest.LogCaptureFixture, scenario: str) -> None:
    response = await service.chat(chat_body(scenario=scenario))
    assert response.status == 500
    assert await response.json() == {"detail": {"error": 10}}
    assert response.headers["Retry-After"] == "300"
    assert global_budget_samples(service) == (1, 1)
    latency = {"result": "error", **CHAT}
    assert sample(service, "mlpa_chat_completion_latency_seconds_count", latency) == 1
    [logged] = events(caplog, "Global budget limit exceeded")
    assert logged["level"] == "WARNING" and logged["user"] == "test-uid:ai"
    assert "ExceededBudget: User=default_user_id over budget" in logged["upstream_detail"]
    assert not [e for e in events(caplog) if e["level"] in ("ERROR", "CRITICAL")]


async def test_streamed_chat_ends_with_the_code_10_frame(service: Service) -> None:
    response = await service.chat(chat_body(stream=True, scenario="global_budget_400"))
    assert response.status == 200
    assert await response.read() == b'data: {"error": 10}\n\n'
    assert global_budget_samples(service) == (1, 1)


async def test_search_is_a_500_with_code_10(service: Service) -> None:
    response = await service.client.post(
        "/v1/search",
        json={"query": "foxes [fake:global_budget_400]", "max_results": 2},
        headers={"authorization": f"Bearer {service.token}"},
    )
    assert response.status == 500
    assert await response.json() == {"detail": {"error": 10}}
    assert response.headers["Retry-After"] == "300"
    labels = {"reason": "global_budget_exceeded", "model": "exa-search", "service_type": "search", "purpose": ""}
    assert sample(service, "mlpa_search_request_rejections_total", labels) == 1
    assert sample(service, "mlpa_search_latency_seconds_count", {"result": "error"}) == 1
