"""The 422 items come from one owner (`validation.py`) and read the same on every route."""

from __future__ import annotations

import json

from ..conftest import Service, ServiceFactory, chat_body

NOT_AN_OBJECT = [
    {"loc": ["body"], "msg": "Input should be a valid dictionary or object to extract fields from", "type": "model_attributes_type"}
]


async def detail(response) -> list:
    assert response.status == 422, await response.text()
    return (await response.json())["detail"]


async def test_one_message_for_a_body_that_is_not_an_object(service: Service) -> None:
    for path, headers in (
        ("/v1/chat/completions", service.headers()),
        ("/v1/search", service.headers(service_type="search")),
        ("/verify/play", {"content-type": "application/json"}),
    ):
        response = await service.client.post(path, data=b"[1, 2]", headers=headers)
        assert await detail(response) == NOT_AN_OBJECT, path


async def test_an_integer_too_large_for_a_float_is_a_422_not_a_500(service: Service) -> None:
    raw = json.dumps(chat_body(temperature=10**400)).encode()
    response = await service.client.post("/v1/chat/completions", data=raw, headers=service.headers())
    assert await detail(response) == [{"loc": ["body", "temperature"], "msg": "Input should be a valid number", "type": "float_type"}]
    assert not service.litellm.requests


async def test_items_never_echo_what_the_client_sent(service: Service) -> None:
    secret = "message content that must not come back"
    response = await service.chat(chat_body(messages=secret, tool_choice=[secret]))
    items = await detail(response)
    assert all(set(item) == {"loc", "msg", "type"} for item in items)
    assert ["body", "messages"] in [item["loc"] for item in items]
    assert secret not in json.dumps(items)


async def test_an_unknown_service_type_reads_the_same_on_the_mock_route(make_service: ServiceFactory) -> None:
    service = await make_service(MLPA_MOCK_ROUTES="true")
    chat = await detail(await service.chat(headers=service.headers(service_type="nope")))
    mock = await detail(
        await service.client.post(
            "/mock/chat/completions_no_auth",
            data=json.dumps(chat_body()),
            headers={"authorization": f"Bearer {service.token}", "service-type": "nope"},
        )
    )
    assert chat == mock and [item["type"] for item in chat] == ["enum"]
    assert chat[0]["msg"].startswith("Input should be 'ai', 's2s'") and chat[0]["msg"].endswith(" or 'search-dev'")
