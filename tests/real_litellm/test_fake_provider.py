"""The loopback provider behind the real LiteLLM, driven over HTTP on its own (runs whether
or not LiteLLM is installed)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.support.fake_provider import PROMPT_TOKENS, REPLY_WORDS, Behaviour, FakeProvider


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(slow_seconds=0.2, trickle_chunks=100, trickle_interval=0.02, cut_after=0.01)


@pytest.fixture
async def base_url(provider: FakeProvider, aiohttp_server) -> str:
    server = await aiohttp_server(provider.make_app())
    return str(server.make_url("")).rstrip("/")


def body(behaviour: Behaviour, *, stream: bool = False) -> dict:
    payload: dict = {"model": behaviour.value, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        payload.update(stream=True, stream_options={"include_usage": True})
    return payload


async def test_ok_json_and_stream(base_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/v1/chat/completions", json=body(Behaviour.OK)) as response:
            payload = await response.json()
        assert payload["choices"][0]["message"]["content"] == "".join(REPLY_WORDS)
        assert payload["usage"]["prompt_tokens"] == PROMPT_TOKENS
        async with session.post(f"{base_url}/v1/chat/completions", json=body(Behaviour.OK, stream=True)) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            frames = (await response.text()).split("\n\n")
    payloads = [frame[len("data: ") :] for frame in frames if frame]
    assert payloads[-1] == "[DONE]"
    usage = json.loads(payloads[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(REPLY_WORDS)


@pytest.mark.parametrize(
    "behaviour,status",
    [(Behaviour.RATE_LIMIT, 429), (Behaviour.THROTTLE, 429), (Behaviour.CONTEXT, 400),
     (Behaviour.BAD_PARAM, 400), (Behaviour.SERVER_ERROR, 500)],
)  # fmt: skip
async def test_error_answers(base_url: str, behaviour: Behaviour, status: int) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/v1/chat/completions", json=body(behaviour)) as response:
            assert response.status == status
            assert "message" in (await response.json())["error"]
            assert ("Retry-After" in response.headers) is (behaviour is Behaviour.RATE_LIMIT)


async def test_mid_stream_cut_after_two_chunks(base_url: str) -> None:
    received = b""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/v1/chat/completions", json=body(Behaviour.MID_STREAM, stream=True)) as response:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in response.content.iter_any():
                    received += data
    assert received.count(b"data: ") == 3 and b"[DONE]" not in received


async def test_slow_and_client_leaving_are_recorded(provider: FakeProvider, base_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                f"{base_url}/v1/chat/completions", json=body(Behaviour.SLOW), timeout=aiohttp.ClientTimeout(total=0.05)
            )
        response = await session.post(f"{base_url}/v1/chat/completions", json=body(Behaviour.TRICKLE, stream=True))
        assert b"data: " in await response.content.readany()
        response.close()
    for behaviour in (Behaviour.SLOW, Behaviour.TRICKLE):
        [record] = provider.requests_for(behaviour)
        await asyncio.wait_for(record.disconnected.wait(), 2)


async def test_search_answers_like_exa(provider: FakeProvider, base_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/search", json={"query": "q", "numResults": 2}) as response:
            payload = await response.json()
    assert [result["title"] for result in payload["results"]] == ["Result 1 for q", "Result 2 for q"]
    assert provider.requests[-1].path == "/search"
