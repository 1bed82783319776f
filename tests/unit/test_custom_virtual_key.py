"""The `litellm-virtual-key` header (MLPA 1.0.39 §A.6): with `ALLOW_CUSTOM_VIRTUAL_KEY=true` its
trimmed value is the Bearer key of the completion (streamed or not) and search calls to
LiteLLM; blank, or the setting off, the service's key. It never reaches a body or a log line,
and LiteLLM's admin calls keep the master key. Over real HTTP against the loopback fake
LiteLLM, which records the Authorization it received."""

from __future__ import annotations

from typing import Any

import pytest

from ..conftest import TEST_SECRETS, Service, ServiceFactory, chat_body

CLIENT_KEY = "sk-client-own-5e6f7a8b"
SERVICE_KEY = TEST_SECRETS["MLPA_VIRTUAL_KEY"]


async def allowing(make_service: ServiceFactory) -> Service:
    service = await make_service(ALLOW_CUSTOM_VIRTUAL_KEY="true")
    service.litellm.other_virtual_keys.add(CLIENT_KEY)
    return service


async def search(service: Service, **headers: str) -> Any:
    return await service.client.post(
        "/v1/search",
        json={"query": "foxes", "max_results": 1},
        headers={"authorization": f"Bearer {service.token}", **headers},
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_clients_key_is_the_bearer_of_its_completion(
    make_service: ServiceFactory, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    service = await allowing(make_service)
    response = await service.chat(chat_body(stream=stream), headers=service.headers(litellm_virtual_key=f"  {CLIENT_KEY}\t"))
    assert response.status == 200
    await response.read()
    [sent] = service.litellm.requests_to("/v1/chat/completions")
    assert sent.bearer == CLIENT_KEY
    assert sent.json["user"] == "test-uid:ai"  # the end user is still named
    assert CLIENT_KEY.encode() not in sent.body
    # Provisioning (`/customer/new`) keeps the master key.
    [created] = service.litellm.requests_to("/customer/new")
    assert created.bearer == TEST_SECRETS["MASTER_KEY"]
    assert CLIENT_KEY not in caplog.text


async def test_the_clients_key_is_the_bearer_of_its_search(make_service: ServiceFactory, caplog: pytest.LogCaptureFixture) -> None:
    service = await allowing(make_service)
    response = await search(service, **{"Litellm-Virtual-Key": CLIENT_KEY})
    assert response.status == 200
    [sent] = service.litellm.requests_to("/v1/search/exa-search")
    assert sent.bearer == CLIENT_KEY
    assert CLIENT_KEY.encode() not in sent.body
    assert CLIENT_KEY not in caplog.text


@pytest.mark.parametrize("value", [None, "", "   "], ids=["absent", "empty", "blank"])
async def test_no_key_or_a_blank_one_is_the_services(make_service: ServiceFactory, value: str | None) -> None:
    service = await allowing(make_service)
    extra = {} if value is None else {"litellm-virtual-key": value}
    assert (await service.chat(headers=service.headers(**extra))).status == 200
    assert (await search(service, **extra)).status == 200
    assert [r.bearer for r in service.litellm.requests if r.path != "/customer/new"] == [SERVICE_KEY, SERVICE_KEY]


async def test_the_header_is_ignored_unless_allowed(make_service: ServiceFactory) -> None:
    service = await make_service()
    service.litellm.other_virtual_keys.add(CLIENT_KEY)
    for value in (CLIENT_KEY, "sk-nobody-knows"):
        assert (await service.chat(headers=service.headers(litellm_virtual_key=value))).status == 200
        assert (await search(service, **{"litellm-virtual-key": value})).status == 200
    assert {r.bearer for r in service.litellm.requests if r.path != "/customer/new"} == {SERVICE_KEY}


async def test_a_key_litellm_does_not_know_is_litellms_refusal(make_service: ServiceFactory) -> None:
    """No check of the service's own: LiteLLM's 401 is an unclassified upstream error."""
    service = await allowing(make_service)
    response = await service.chat(headers=service.headers(litellm_virtual_key="sk-nobody-knows"))
    assert (response.status, await response.json()) == (401, {"detail": {"error": "Upstream service returned an error"}})
    assert service.litellm.requests_to("/v1/chat/completions")[-1].bearer == "sk-nobody-knows"
