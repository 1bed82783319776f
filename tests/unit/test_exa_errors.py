"""`mlpa_exa_errors_total` (the reference's Exa error counter, MLPA 1.0.39 §A.18.1): LiteLLM's
error answers for the Exa-backed models (`exa-search` on search, `exa` on chat, streamed or not),
labelled with the status and Exa's error tag found in the raw body. The reference's three
cases, over real HTTP against the loopback fake LiteLLM; then the tag reading itself."""

from __future__ import annotations

import json

import pytest

from mlpa_aiohttp.observability.exa_errors import (
    EXA_ERROR_STATUSES,
    exa_error_labels,
    find_exa_tag,
)
from tests.support.metrics import sample, samples

from ..conftest import Service, chat_body

EXA_ERRORS = "mlpa_exa_errors_total"


async def search(service: Service, scenario: str):
    return await service.client.post(
        "/v1/search",
        json={"query": f"foxes [fake:{scenario}]", "max_results": 1},
        headers={"authorization": f"Bearer {service.token}"},
    )


@pytest.mark.parametrize(
    ("scenario", "status_code", "tag", "client_status"),
    [
        # LiteLLM wraps an overloaded Exa as its own 500: Exa's real status is the label.
        ("exa_overloaded_500", "503", "SERVICE_OVERLOADED", 500),
        ("internal_server_error_500", "500", "untagged", 500),
        ("exa_rate_limit_429", "429", "RATE_LIMIT_EXCEEDED", 429),
    ],
)
async def test_the_references_three_cases_on_search(
    service: Service, scenario: str, status_code: str, tag: str, client_status: int
) -> None:
    response = await search(service, scenario)
    assert response.status == client_status
    assert samples(service, EXA_ERRORS) == [({"model": "exa-search", "status_code": status_code, "tag": tag}, 1.0)]
    assert sample(service, "mlpa_search_latency_seconds_count", {"result": "error"}) == 1
    rejected = {"reason": "rate_limited", "model": "exa-search", "service_type": "search", "purpose": ""}
    # The 429 is classified too: both counters move.
    assert sample(service, "mlpa_search_request_rejections_total", rejected) == (1 if client_status == 429 else 0)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_chat_with_exa_counts_the_initial_error_status(service: Service, stream: bool) -> None:
    headers = service.headers(service_type="answer")
    response = await service.chat(chat_body(model="exa", stream=stream, scenario="exa_overloaded_500"), headers=headers)
    await response.read()
    assert samples(service, EXA_ERRORS) == [({"model": "exa", "status_code": "503", "tag": "SERVICE_OVERLOADED"}, 1.0)]


async def test_a_classified_error_without_a_tag_records_nothing(service: Service) -> None:
    """LiteLLM's own refusals (the global budget, a user's budget) are not Exa's."""
    assert (await search(service, "global_budget_400")).status == 500
    answer = service.headers(service_type="answer")
    assert (await service.chat(chat_body(model="exa", scenario="budget_422"), headers=answer)).status == 429
    assert samples(service, EXA_ERRORS) == []


async def test_other_models_record_nothing_and_the_answer_is_the_same(service: Service) -> None:
    exa = await service.chat(chat_body(model="exa", scenario="exa_overloaded_500"), headers=service.headers(service_type="answer"))
    other = await service.chat(chat_body(model="gpt-oss-120b", scenario="exa_overloaded_500"))
    assert (exa.status, await exa.read(), exa.headers.get("Retry-After")) == (
        other.status,
        await other.read(),
        other.headers.get("Retry-After"),
    )
    assert [labels["model"] for labels, _ in samples(service, EXA_ERRORS)] == ["exa"]


def exa_body(tag: str, *, escaped: bool) -> str:
    inner = json.dumps({"requestId": "r1", "error": "e", "tag": tag}, separators=(",", ":"))
    if not escaped:
        return inner
    return json.dumps({"error": {"message": f"litellm.APIError: Exa_aiException - {inner}", "code": "500"}})


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "json-escaped"])
def test_the_tag_is_found_plain_or_escaped(escaped: bool) -> None:
    assert find_exa_tag(exa_body("NO_MORE_CREDITS", escaped=escaped)) == "NO_MORE_CREDITS"
    assert exa_error_labels("exa", 500, exa_body("NO_MORE_CREDITS", escaped=escaped), classified=False) == (
        "exa", "402", "NO_MORE_CREDITS"
    )


def test_the_labels_stay_bounded() -> None:
    # A tag Exa may add later: "other", with LiteLLM's status.
    assert exa_error_labels("exa-search", 502, exa_body("BRAND_NEW_TAG", escaped=True), classified=False) == (
        "exa-search", "502", "other"
    )
    # A tagged error counts even when classified; an untagged classified one does not.
    assert exa_error_labels("exa", 429, exa_body("RATE_LIMIT_EXCEEDED", escaped=True), classified=True) is not None
    assert exa_error_labels("exa", 429, "Too Many Requests", classified=True) is None
    assert exa_error_labels("liner", 500, exa_body("SERVICE_OVERLOADED", escaped=True), classified=False) is None
    assert exa_error_labels("exa", 999, "?", classified=False) == ("exa", "other", "untagged")
    assert all(status.isdigit() and len(status) == 3 for status in EXA_ERROR_STATUSES.values())
