"""The service against the real LiteLLM proxy (1.106.12, no database, retries off), whose
models point at a loopback provider of ours: completions streamed and not with usage
counted, every upstream error case with the spec's answer, a budget error at LiteLLM's
default 422, a client disconnect closing LiteLLM's provider request, search, and one
completion through gunicorn."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fake_provider import PROMPT_TOKENS, REPLY_WORDS, Behaviour
from tests.support.processes import stop_process

from .conftest import MASTER_KEY, NOT_INSTALLED, PRICE_PER_TOKEN, Fakes, RealLiteLLM, Service, free_port, litellm_executable, service_env, start_service

if litellm_executable() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

CHAT_PATH = "/v1/chat/completions"
REPLY = "".join(REPLY_WORDS)
GENERIC = "Upstream service returned an error"


def chat(model: str, *, stream: bool = False) -> str:
    return json.dumps({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})


def sse_payloads(body: bytes) -> list[str]:
    return [frame[len("data: ") :] for frame in body.decode().split("\n\n") if frame.startswith("data: ")]


def streamed_content(payloads: list[str]) -> str:
    text = ""
    for payload in payloads:
        if payload == "[DONE]":
            continue
        for choice in json.loads(payload).get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    return text


async def metric(service: Service, name: str, labels: dict[str, str]) -> float:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{service.base_url}/metrics") as response:
            exposition = await response.text()
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def post(service: Service, body: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{service.base_url}{CHAT_PATH}", data=body, headers=service.headers(**headers)) as response:
            return response.status, dict(response.headers), await response.read()


def test_litellm_is_the_pinned_version(real_litellm: RealLiteLLM) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{real_litellm.base_url}/public/model_hub/info", timeout=5) as response:
        info = json.load(response)
    assert info["litellm_version"] == "1.106.12"
    print(f"real LiteLLM started in {real_litellm.started_in:.1f} s", file=sys.stderr)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_completion_with_usage_counted(served: Service, stream: bool) -> None:
    tokens = {"model": "ok-model", "service_type": "ai"}
    prompt_before = await metric(served, "mlpa_chat_tokens_total", {"type": "prompt", **tokens})
    completion_before = await metric(served, "mlpa_chat_tokens_total", {"type": "completion", **tokens})

    status, headers, body = await post(served, chat("ok-model", stream=stream))

    assert status == 200
    if stream:
        assert headers["Content-Type"] == "text/event-stream; charset=utf-8"
        payloads = sse_payloads(body)
        assert payloads[-1] == "[DONE]"
        assert streamed_content(payloads) == REPLY
        usage = json.loads(payloads[-2])
        assert usage["choices"] == [{"index": 0, "delta": {}}]  # LiteLLM's usage chunk
    else:
        assert json.loads(body)["choices"][0]["message"]["content"] == REPLY
    assert await metric(served, "mlpa_chat_tokens_total", {"type": "prompt", **tokens}) == prompt_before + PROMPT_TOKENS
    assert await metric(served, "mlpa_chat_tokens_total", {"type": "completion", **tokens}) == completion_before + len(REPLY_WORDS)
    assert await metric(served, "mlpa_litellm_routed_completions_total", {"requested_model": "ok-model"}) >= 1


async def test_reported_cost_of_a_priced_model(served: Service) -> None:
    routed = {"requested_model": "priced-model", "service_type": "ai"}
    before = await metric(served, "mlpa_litellm_reported_cost_usd_total", routed)
    status, headers, _ = await post(served, chat("priced-model"))
    assert status == 200
    expected = (PROMPT_TOKENS + len(REPLY_WORDS)) * PRICE_PER_TOKEN  # x-litellm-response-cost
    assert await metric(served, "mlpa_litellm_reported_cost_usd_total", routed) == pytest.approx(before + expected)


# model (LiteLLM model group) -> (status, body) of the JSON answer and its Retry-After
ERRORS: dict[str, tuple[int, Any, str | None]] = {
    "ratelimit-model": (429, {"detail": {"error": 2}}, "60"),  # provider RPM 429 (Retry-After 7)
    "throttle-model": (429, {"detail": {"error": 2}}, "60"),  # provider "resource exhausted"
    "ctx-model": (413, {"detail": {"error": 3}}, None),
    "no-such-model": (400, {"detail": {"error": 8}}, None),  # not configured in LiteLLM
    "badparam-model": (400, {"detail": {"error": GENERIC}}, None),
    "e500-model": (500, {"detail": {"error": GENERIC}}, None),
    "slow-model": (408, {"detail": {"error": GENERIC}}, None),  # LiteLLM's provider timeout
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("model", sorted(ERRORS))
async def test_upstream_error_gets_the_spec_answer(served: Service, model: str, stream: bool) -> None:
    expected_status, expected_body, retry_after = ERRORS[model]
    started = time.monotonic()
    status, headers, body = await post(served, chat(model, stream=stream))
    elapsed = time.monotonic() - started
    if stream:
        # A stream that fails before its first byte: LiteLLM answers plain JSON with a status,
        # the service its one SSE error frame.
        assert status == 200
        code = expected_body["detail"]["error"]
        frame = {"error": code} if isinstance(code, int) else {"code": expected_status, "error": code}
        assert body.decode() == f"data: {json.dumps(frame)}\n\n"
    else:
        assert (status, json.loads(body), headers.get("Retry-After")) == (expected_status, expected_body, retry_after)
    assert elapsed < 10, f"{model} took {elapsed:.1f} s: are LiteLLM's retries on?"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_budget_error_at_litellm_default_422_is_the_budget_answer(
    served: Service, real_litellm: RealLiteLLM, stream: bool
) -> None:
    # LiteLLM's BudgetExceededError (raised by a pre-call hook: its end-user check needs a
    # database) comes back with LiteLLM's default budget status, 422.
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{real_litellm.base_url}{CHAT_PATH}",
            data=json.dumps({**json.loads(chat("ok-model", stream=stream)), "user": "over-budget-direct:ai"}),
            headers={"authorization": f"Bearer {MASTER_KEY}", "content-type": "application/json"},
        ) as direct:
            assert direct.status == 422
            assert "ExceededBudget" in (await direct.json())["error"]["message"]

    labels = {"outcome": "excluded", "reason": "budget_exceeded"}
    excluded_before = await metric(served, "mlpa_chat_availability_total", labels)
    status, headers, body = await post(served, chat("ok-model", stream=stream), user="over-budget-user")
    if stream:
        assert (status, body) == (200, b'data: {"error": 1}\n\n')
    else:
        assert (status, json.loads(body), headers.get("Retry-After")) == (429, {"detail": {"error": 1}}, "86400")
    assert await metric(served, "mlpa_chat_availability_total", labels) == excluded_before + 1


async def test_provider_failure_mid_stream(served: Service, fakes: Fakes) -> None:
    status, _, body = await post(served, chat("midstream-model", stream=True))
    assert status == 200
    payloads = sse_payloads(body)
    assert streamed_content(payloads[:-1]) == "".join(REPLY_WORDS[:2]), body
    # LiteLLM ends the 200 stream with an in-band error event and no [DONE].
    assert "[DONE]" not in payloads
    last = json.loads(payloads[-1])
    assert "error" in last and "choices" not in last


async def test_client_disconnect_closes_litellm_provider_request(served: Service, fakes: Fakes) -> None:
    provider = fakes.provider
    before = len(provider.requests_for(Behaviour.TRICKLE))
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{served.base_url}{CHAT_PATH}", data=chat("trickle-model", stream=True), headers=served.headers()
        )
        assert response.status == 200
        assert b"data: " in await response.content.readany()
        left_at = time.monotonic()
        response.close()
    [record] = provider.requests_for(Behaviour.TRICKLE)[before:]
    stream_length = provider.trickle_chunks * provider.trickle_interval
    deadline = left_at + 5.0
    while record.disconnected_at is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert record.disconnected_at is not None, f"the provider's {stream_length:.0f} s stream was not closed within 5 s"
    latency = record.disconnected_at - left_at
    print(f"provider request closed {latency * 1000:.0f} ms after the client left", file=sys.stderr)
    assert latency < stream_length / 2


async def test_search_through_litellm(served: Service, fakes: Fakes) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{served.base_url}/v1/search",
            json={"query": "firefox", "max_results": 2},
            headers={"authorization": served.headers()["authorization"]},
        ) as response:
            status, payload = response.status, await response.json()
    assert status == 200, payload
    assert [result["title"] for result in payload["results"]] == ["Result 1 for firefox", "Result 2 for firefox"]
    sent = fakes.provider.requests[-1]
    assert sent.path == "/search" and sent.body["query"] == "firefox"


async def test_gunicorn_streams_through_litellm(real_litellm: RealLiteLLM, fakes: Fakes, tmp_path) -> None:
    port = free_port()
    metrics_dir = tmp_path / "prometheus"
    env = service_env(real_litellm, fakes, port, GUNICORN_WORKERS="1", PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    command = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "-b", f"127.0.0.1:{port}", "mlpa_aiohttp.app:app_factory"]
    service = start_service(command, env, tmp_path / "gunicorn.log", fakes)
    try:
        status, _, body = await post(service, chat("ok-model", stream=True))
        assert status == 200
        payloads = sse_payloads(body)
        assert payloads[-1] == "[DONE]" and streamed_content(payloads) == REPLY
        status, _, body = await post(service, chat("ratelimit-model"))
        assert (status, json.loads(body)) == (429, {"detail": {"error": 2}})
    finally:
        stop_process(service.process)
