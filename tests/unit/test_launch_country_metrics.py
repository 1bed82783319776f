"""The launch-market metrics (MLPA 1.0.39 §A.9): `mlpa_chat_completion_latency_by_country_seconds`,
`mlpa_chat_completion_ttft_by_country_seconds` and `mlpa_chat_availability_by_country_total`,
written as twins of their parents at every recording site, `client_country` the raw
`X-Geo-Country` kept only when it is exactly one of `MLPA_LAUNCH_COUNTRIES`, else `other`.
Over real HTTP against the loopback fake LiteLLM."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.support.metrics import sample, samples

from ..conftest import Service, ServiceFactory, chat_body

GEO = "X-Geo-Country"


def by_country(service: Service, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(sorted(labels.items())): value for labels, value in samples(service, name)}


def totals(service: Service, name: str, keep: tuple[str, ...]) -> Counter[tuple[str, ...]]:
    """The samples of `name` summed over every label but `keep`."""
    summed: Counter[tuple[str, ...]] = Counter()
    for labels, value in samples(service, name):
        summed[tuple(labels[k] for k in keep)] += value
    return summed


async def test_a_stream_writes_all_three_twins(service: Service) -> None:
    response = await service.chat(chat_body(stream=True), headers=service.headers(**{GEO: "FR"}))
    assert response.status == 200
    await response.read()
    twin = {"client_country": "FR", "service_type": "ai"}
    assert sample(service, "mlpa_chat_completion_latency_by_country_seconds_count", {"result": "success", **twin}) == 1
    assert sample(service, "mlpa_chat_completion_ttft_by_country_seconds_count", twin) == 1
    assert sample(service, "mlpa_chat_availability_by_country_total", {"outcome": "success", **twin}) == 1


@pytest.mark.parametrize(
    ("env", "header", "expected"),
    [
        ({}, "US", "US"),
        ({}, "fr", "other"),  # case-sensitive
        ({}, "GB", "other"),  # a country, not a launch one
        ({}, "XX", "other"),  # spoofed
        ({}, None, "other"),  # absent
        ({"MLPA_LAUNCH_COUNTRIES": "US, GB,,"}, "GB", "GB"),
        ({"MLPA_LAUNCH_COUNTRIES": "US,GB"}, "FR", "other"),
    ],
)
async def test_the_launch_country_clamp(
    make_service: ServiceFactory, env: dict[str, str], header: str | None, expected: str
) -> None:
    service = await make_service(**env)
    headers = service.headers() if header is None else service.headers(**{GEO: header})
    assert (await service.chat(headers=headers)).status == 200
    assert samples(service, "mlpa_chat_availability_by_country_total") == [
        ({"outcome": "success", "client_country": expected, "service_type": "ai"}, 1.0)
    ]
    # The full-ISO clamp of mlpa_requests_by_country_total is unchanged.
    iso = header if header in ("US", "GB", "FR") else "unknown"
    assert sample(service, "mlpa_requests_by_country_total", {"service_type": "ai", "model": "gpt-oss-120b", "client_country": iso}) == 1


async def test_every_site_writes_its_twin(service: Service) -> None:
    """Each parent sample has its twin: refusals before the relay (auth, pinning, the size
    limit's 413), successes, upstream errors (the global budget's failure included), streamed
    or not. Summed over the labels the twins do not have, the counts agree."""
    fr, us = service.headers(**{GEO: "FR"}), service.headers(**{GEO: "US"})
    requests: list[tuple[dict[str, Any], dict[str, str]]] = [
        (chat_body(), fr),
        (chat_body(stream=True), us),
        (chat_body(scenario="server_500"), fr),
        (chat_body(stream=True, scenario="server_500"), us),
        (chat_body(scenario="global_budget_400"), fr),
        (chat_body(stream=True, scenario="budget_422"), fr),
        (chat_body(model="exa"), us),  # pinned to other types: 400
        (chat_body(), {**fr, "authorization": "Bearer not-a-token"}),  # 401
    ]
    for body, headers in requests:
        response = await service.chat(body, headers=headers)
        await response.read()
    oversized = await service.client.post(
        "/v1/chat/completions", data=b"x" * (3 * 1024 * 1024 + 1), headers={**us, "Content-Type": "application/json"}
    )
    assert oversized.status == 413

    availability = totals(service, "mlpa_chat_availability_total", ("outcome", "service_type"))
    twins = totals(service, "mlpa_chat_availability_by_country_total", ("outcome", "service_type"))
    assert availability == twins and sum(twins.values()) == len(requests) + 1
    latency = totals(service, "mlpa_chat_completion_latency_seconds_count", ("result", "service_type"))
    assert latency == totals(service, "mlpa_chat_completion_latency_by_country_seconds_count", ("result", "service_type"))
    ttft = sum(totals(service, "mlpa_chat_completion_ttft_seconds_count", ()).values())
    assert ttft == sum(totals(service, "mlpa_chat_completion_ttft_by_country_seconds_count", ()).values()) == 1
    # The countries as sent: the 413's twin uses the same clamp (its header), the global
    # budget's is a failure.
    by_outcome = totals(service, "mlpa_chat_availability_by_country_total", ("outcome", "client_country"))
    assert by_outcome == {
        ("success", "FR"): 1,
        ("success", "US"): 1,
        ("failure", "FR"): 2,  # server_500, global budget
        ("failure", "US"): 1,
        ("excluded", "FR"): 2,  # budget, 401
        ("excluded", "US"): 2,  # pinning, 413
    }
