"""Chat request handling before the relay: validation, model rules, purpose, auth, users."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from mlpa_aiohttp import keys

from tests.support.metrics import sample
from tests.support.store_seeding import seed_user
from tests.support.waiting import wait_for

from ..conftest import DEV_TOKEN, Service, chat_body, events


def availability(service: Service, outcome: str, reason: str, model: str = "gpt-oss-120b", st: str = "ai") -> float:
    labels = {"outcome": outcome, "reason": reason, "model": model, "service_type": st, "purpose": ""}
    return sample(service, "mlpa_chat_availability_total", labels)


# -- 422: headers and body ------------------------------------------------------------


async def test_missing_headers_are_422_in_the_reference_shape(service: Service) -> None:
    response = await service.client.post("/v1/chat/completions", json=chat_body())
    assert response.status == 422
    detail = (await response.json())["detail"]
    locs = sorted(tuple(d["loc"]) for d in detail)
    assert locs == [("header", "authorization"), ("header", "service-type")]
    assert all(d["type"] == "missing" and d["msg"] == "Field required" for d in detail)


async def test_unknown_service_type_is_422(service: Service) -> None:
    response = await service.chat(headers=service.headers(service_type="chat-gpt"))
    assert response.status == 422
    [error] = (await response.json())["detail"]
    assert error["loc"] == ["header", "service-type"] and error["type"] == "enum"


@pytest.mark.parametrize(
    "raw,loc,type_",
    [
        (b"{not json", ["body", 1], "json_invalid"),
        (b"[1, 2]", ["body"], "model_attributes_type"),
        (b'{"messages": []}', ["body", "model"], "missing"),
        (b'{"model": 5}', ["body", "model"], "string_type"),
        (b'{"model": "m", "stream": "yes please"}', ["body", "stream"], "bool_type"),
        (b'{"model": "m", "max_completion_tokens": 1.5}', ["body", "max_completion_tokens"], "int_type"),
    ],
)
async def test_malformed_bodies_are_422(service: Service, raw: bytes, loc: list, type_: str) -> None:
    response = await service.client.post("/v1/chat/completions", data=raw, headers=service.headers())
    assert response.status == 422
    detail = (await response.json())["detail"]
    assert {"loc": loc, "type": type_} in [{"loc": d["loc"], "type": d["type"]} for d in detail]
    assert not service.litellm.requests, "nothing may reach LiteLLM"


async def test_unknown_body_fields_are_dropped(service: Service) -> None:
    response = await service.chat(chat_body(secret_flag=True, metadata={"x": 1}))
    assert response.status == 200
    sent = service.litellm.requests_to("/v1/chat/completions")[-1].json
    # The client's `metadata` is dropped; the service's own (MLPA 1.0.39) is sent instead.
    assert "secret_flag" not in sent
    assert sent["metadata"] == {"spend_logs_metadata": {"purpose": "", "country_code": ""}}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_spend_logs_metadata_carries_the_purpose_and_the_raw_country(service: Service, stream: bool) -> None:
    """MLPA 1.0.39 §A.7: the validated purpose and the `X-Geo-Country` value as sent, unclamped."""
    headers = service.headers(purpose=" chat ", **{"X-Geo-Country": "zz"})
    response = await service.chat(chat_body(stream=stream), headers=headers)
    assert response.status == 200
    await response.read()
    sent = service.litellm.requests_to("/v1/chat/completions")[-1].json
    assert sent["metadata"] == {"spend_logs_metadata": {"purpose": "chat", "country_code": "zz"}}
    assert "service_type" not in sent and "purpose" not in sent


# -- rules before auth ------------------------------------------------------------------


@pytest.mark.parametrize("model", ["GPT-4", "-lead", "trail-", "a" * 65, "has space", ""])
async def test_model_name_rule_before_auth(service: Service, model: str) -> None:
    response = await service.chat(chat_body(model=model), headers=service.headers(authorization="Bearer nope"))
    assert response.status == 400
    assert await response.json() == {"detail": {"error": 8}}
    assert len(service.fxa.verify_calls) == 0 and service.fxa.jwks_fetches == 0
    assert availability(service, "excluded", "invalid_model_name", model="invalid") == 1


async def test_pinned_model_with_wrong_service_type(service: Service) -> None:
    response = await service.chat(chat_body(model="exa"))
    assert response.status == 400
    assert await response.json() == {"detail": "Invalid service-type value for model exa. Should be one of ['answer', 'sw-answer']"}
    assert availability(service, "excluded", "invalid_service_type_for_model", model="exa") == 1


async def test_pinned_service_type_with_other_model(service: Service) -> None:
    response = await service.chat(headers=service.headers(service_type="answer"))
    assert response.status == 400
    assert await response.json() == {
        "detail": "Invalid service-type value answer for model gpt-oss-120b. Service type answer is only valid for models ['exa']"
    }


@pytest.mark.parametrize(
    ("model", "service_type", "message"),
    [
        ("liner", "ai", "Invalid service-type value for model liner. Should be one of ['liner-answer']"),
        ("exa", "liner-answer", "Invalid service-type value for model exa. Should be one of ['answer', 'sw-answer']"),
        (
            "gpt-oss-120b",
            "sw-answer",
            "Invalid service-type value sw-answer for model gpt-oss-120b. Service type sw-answer is only valid for models ['exa']",
        ),
        (
            "gpt-oss-120b",
            "liner-answer",
            "Invalid service-type value liner-answer for model gpt-oss-120b. "
            "Service type liner-answer is only valid for models ['liner']",
        ),
    ],
)
async def test_the_1_0_39_pinning(service: Service, model: str, service_type: str, message: str) -> None:
    response = await service.chat(chat_body(model=model), headers=service.headers(service_type=service_type))
    assert (response.status, await response.json()) == (400, {"detail": message})
    # `liner` is not on the reference's label allowlist (it holds `liner-answers`): "invalid".
    label = "invalid" if model == "liner" else model
    assert availability(service, "excluded", "invalid_service_type_for_model", model=label, st=service_type) == 1
    assert not service.litellm.requests_to("/v1/chat/completions")


@pytest.mark.parametrize(("model", "service_type"), [("exa", "sw-answer"), ("liner", "liner-answer"), ("exa", "answer")])
async def test_the_new_types_are_served_with_their_models(service: Service, model: str, service_type: str) -> None:
    response = await service.chat(chat_body(model=model), headers=service.headers(service_type=service_type))
    assert response.status == 200, await response.text()
    sent = service.litellm.requests_to("/v1/chat/completions")[-1].json
    assert (sent["model"], sent["user"].rsplit(":", 1)[1]) == (model, service_type)
    # Success-side latency keeps the raw model, `liner` included; availability the clamp.
    latency = {"result": "success", "model": model, "service_type": service_type, "purpose": ""}
    assert sample(service, "mlpa_chat_completion_latency_seconds_count", latency) == 1
    clamped = "invalid" if model == "liner" else model
    assert availability(service, "success", "valid_response", model=clamped, st=service_type) == 1
    # No purposes: any purpose is refused.
    refused = await service.chat(chat_body(model=model), headers=service.headers(service_type=service_type, purpose="chat"))
    assert (refused.status, await refused.json()) == (
        400,
        {"detail": f"Invalid header 'purpose' for service-type '{service_type}'. Valid values: "},
    )


async def test_liner_is_labelled_invalid_on_the_failure_side(service: Service) -> None:
    """The reference's quirk, kept: a failed `liner` completion's samples say "invalid"."""
    headers = service.headers(service_type="liner-answer")
    response = await service.chat(chat_body(model="liner", scenario="server_500"), headers=headers)
    assert response.status == 500
    assert availability(service, "failure", "upstream_error", model="invalid", st="liner-answer") == 1
    assert availability(service, "failure", "upstream_error", model="liner", st="liner-answer") == 0


async def test_invalid_purpose(service: Service) -> None:
    response = await service.chat(headers=service.headers(purpose="essay"))
    assert response.status == 400
    assert (await response.json())["detail"].startswith("Invalid header 'purpose' for service-type 'ai'. Valid values: chat,")


async def test_purpose_required_only_when_configured(make_service) -> None:
    service = await make_service(MLPA_REQUIRE_PURPOSE_HEADER="true")
    response = await service.chat()
    assert response.status == 400
    assert "Header 'purpose' is required for service-type 'ai'" in (await response.json())["detail"]
    assert (await service.chat(headers=service.headers(purpose=" chat "))).status == 200


# -- FxA ---------------------------------------------------------------------------------


async def test_jwt_verified_locally_then_cached(service: Service) -> None:
    assert (await service.chat()).status == 200
    assert (await service.chat()).status == 200
    assert service.fxa.jwks_fetches == 1 and not service.fxa.verify_calls
    source = lambda s: sample(service, "mlpa_fxa_verifications_total", {"verification_source": s})  # noqa: E731
    assert (source("local"), source("cached")) == (1, 1)


async def test_opaque_token_verified_remotely(service: Service) -> None:
    service.fxa.add_opaque_token("opaque-token-1", "opaque-uid", ("profile:uid",))
    response = await service.chat(headers=service.headers(authorization="Bearer opaque-token-1"))
    assert response.status == 200
    assert len(service.fxa.verify_calls) == 1
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["user"] == "opaque-uid:ai"


@pytest.mark.parametrize(
    "make_token",
    [
        lambda fxa: fxa.issue_jwt("u", expires_in=-60),
        lambda fxa: fxa.issue_jwt("u", scopes=("profile:email",)),
        lambda fxa: fxa.issue_jwt("u", typ="JWT"),
        lambda fxa: "unknown-opaque-token",
        lambda fxa: "",
    ],
    ids=["expired", "wrong-scope", "not-access-token", "unknown-opaque", "empty-after-bearer"],
)
async def test_invalid_fxa_tokens(service: Service, make_token) -> None:
    response = await service.chat(headers=service.headers(authorization=f"Bearer {make_token(service.fxa)}"))
    assert response.status == 401
    assert await response.json() == {"detail": "Invalid FxA auth"}
    assert availability(service, "excluded", "auth_rejected") == 1
    assert not service.litellm.requests_to("/v1/chat/completions")


async def test_empty_authorization(service: Service) -> None:
    response = await service.chat(headers=service.headers(authorization=""))
    assert response.status == 401
    assert await response.json() == {"detail": "Missing authorization header"}


async def test_unknown_kid_refetches_jwks_once(service: Service) -> None:
    assert (await service.chat()).status == 200
    service.fxa.rotate_key()
    fresh = service.fxa.issue_jwt("rotated-uid")
    # The verifier throttles refetches; age its last fetch past the throttle.
    verifier = service.app[keys.AUTHENTICATOR]._fxa
    verifier._keys_fetched_at -= 10
    response = await service.chat(headers=service.headers(authorization=f"Bearer {fresh}"))
    assert response.status == 200
    assert service.fxa.jwks_fetches == 2


async def test_multi_scope_race_first_success_wins(make_service) -> None:
    service = await make_service(ADDITIONAL_FXA_SCOPE_1="https://identity.mozilla.com/apps/vpn")
    service.fxa.add_opaque_token("vpn-only", "vpn-uid", ("https://identity.mozilla.com/apps/vpn",))
    response = await service.chat(headers=service.headers(authorization="Bearer vpn-only"))
    assert response.status == 200
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["user"] == "vpn-uid:ai"


# -- dev key -------------------------------------------------------------------------------


async def test_dev_service_type_needs_the_dev_key(service: Service) -> None:
    missing = await service.chat(headers=service.headers(service_type="ai-dev"))
    assert missing.status == 401
    assert "x-dev-authorization required" in (await missing.json())["detail"]
    wrong = await service.chat(headers=service.headers(service_type="ai-dev", x_dev_authorization="nope"))
    assert await wrong.json() == {"detail": "Invalid x-dev-authorization"}
    empty = await service.chat(headers=service.headers(service_type="ai-dev", x_dev_authorization=""))
    assert await empty.json() == {"detail": "Missing authorization header (FxA required when x-dev-authorization is present)"}
    ok = await service.chat(headers=service.headers(service_type="ai-dev", x_dev_authorization=DEV_TOKEN))
    assert ok.status == 200
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["user"] == "test-uid:ai-dev"


async def test_dev_key_ignored_for_other_service_types(service: Service) -> None:
    response = await service.chat(headers=service.headers(x_dev_authorization="whatever"))
    assert response.status == 200


async def test_dev_key_still_needs_fxa(service: Service) -> None:
    response = await service.chat(
        headers=service.headers(service_type="ai-dev", x_dev_authorization=DEV_TOKEN, authorization="Bearer bad")
    )
    assert response.status == 401 and await response.json() == {"detail": "Invalid FxA auth"}


async def test_device_auth_not_enabled_is_401(service: Service) -> None:
    response = await service.chat(headers=service.headers(use_app_attest="true"))
    assert response.status == 401


async def test_bad_bool_header_is_422(service: Service) -> None:
    response = await service.chat(headers=service.headers(use_play_integrity="perhaps"))
    assert response.status == 422


# -- users ---------------------------------------------------------------------------------


async def test_new_user_is_created_in_litellm_with_the_tier_budget(service: Service) -> None:
    response = await service.chat(headers=service.headers(service_type="memories"))
    assert response.status == 200
    [created] = service.litellm.requests_to("/customer/new")
    assert created.json == {"user_id": "test-uid:memories", "budget_id": "end-user-budget-memories"}
    assert created.headers["authorization"] == "Bearer sk-test-master"
    await service.chat(headers=service.headers(service_type="memories"))
    assert len(service.litellm.requests_to("/customer/new")) == 1, "existing users are not re-created"


async def test_provisioning_failure_is_500(make_service) -> None:
    service = await make_service(LITELLM_API_BASE="http://127.0.0.1:9")
    response = await service.chat()
    assert response.status == 500
    assert await response.json() == {"detail": {"error": "Error fetching user info"}}
    assert availability(service, "failure", "provisioning_failure") == 1


async def test_blocked_user_is_403(service: Service) -> None:
    await seed_user(service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai", blocked=True)
    response = await service.chat()
    assert response.status == 403
    assert await response.json() == {"detail": {"error": "User is blocked."}}
    assert availability(service, "excluded", "blocked") == 1
    assert not service.litellm.requests_to("/v1/chat/completions")


async def test_signup_cap(make_service) -> None:
    service = await make_service(MLPA_ENFORCE_SIGNIN_CAP="true", MLPA_MAX_SIGNED_IN_USERS="1")
    assert (await service.chat()).status == 200
    # the same identity on another capped type shares the slot
    assert (await service.chat(headers=service.headers(service_type="memories"))).status == 200
    other = service.fxa.issue_jwt("second-uid")
    refused = await service.chat(headers=service.headers(authorization=f"Bearer {other}"))
    assert refused.status == 403 and await refused.json() == {"detail": {"error": 4}}
    assert availability(service, "excluded", "signup_cap_exceeded") == 1
    # uncapped types bypass the cap
    assert (await service.chat(headers=service.headers(authorization=f"Bearer {other}", service_type="s2s"))).status == 200


# -- JSON path -----------------------------------------------------------------------------


async def test_json_completion(service: Service) -> None:
    response = await service.chat()
    assert response.status == 200
    payload = await response.json()
    assert payload["choices"][0]["message"]["content"]
    assert "x-litellm-response-cost" not in response.headers
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_completion_latency_seconds_count", {"result": "success", **labels}) == 1
    routed = {"requested_model": "gpt-oss-120b", "backend": "https://api.fake-provider.test/v1", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_litellm_routed_completions_total", {**routed, "fallback_used": "false"}) == 1


EXPECTED_JSON = {
    "budget_400": (429, {"detail": {"error": 1}}, "86400"),
    "budget_429": (429, {"detail": {"error": 1}}, "86400"),
    "rate_limit_429": (429, {"detail": {"error": 2}}, "60"),
    "throttling_429": (429, {"detail": {"error": 2}}, "60"),  # wrapped provider 429
    "context_window_400": (413, {"detail": {"error": 3}}, None),
    "invalid_model_400": (400, {"detail": {"error": 8}}, None),
    "invalid_argument_400": (400, {"detail": {"error": 9}}, None),
    "unclassified_400": (400, {"detail": {"error": "Upstream service returned an error"}}, None),
    "unclassified_429": (429, {"detail": {"error": "Upstream service returned an error"}}, None),
    "generate_400": (400, {"detail": {"error": "Upstream service returned an error"}}, None),
    "server_500": (500, {"detail": {"error": "Upstream service returned an error"}}, None),
}


@pytest.mark.parametrize("scenario", sorted(EXPECTED_JSON))
async def test_json_upstream_errors(service: Service, scenario: str) -> None:
    status, body, retry_after = EXPECTED_JSON[scenario]
    response = await service.chat(chat_body(scenario=scenario))
    assert response.status == status
    assert await response.json() == body
    assert response.headers.get("Retry-After") == retry_after


async def test_budget_is_latency_error_but_availability_excluded(service: Service) -> None:
    await service.chat(chat_body(scenario="budget_429"))
    labels = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_completion_latency_seconds_count", {"result": "error", **labels}) == 1
    assert availability(service, "excluded", "budget_exceeded") == 1
    assert sample(service, "mlpa_chat_request_rejections_total", {"reason": "budget_exceeded", **labels}) == 1


async def test_transport_error_is_502_and_logged_once(make_service, fake_litellm_server, caplog) -> None:
    service = await make_service()
    await seed_user(service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai")
    # Then LiteLLM goes away: its port refuses connections.
    await fake_litellm_server[1].close()
    response = await service.chat()
    assert response.status == 502
    assert await response.json() == {"detail": {"error": "Failed to proxy request"}}
    [logged] = events(caplog, "completion_proxy_failed")
    assert logged["level"] == "ERROR" and logged["error_type"] == "ClientConnectorError"
    assert logged["user"] == "test-uid:ai" and logged["model"] == "gpt-oss-120b"
    assert availability(service, "failure", "upstream_error") == 1


async def _upstream_asked(service: Service) -> None:
    await wait_for(lambda: service.litellm.requests_to("/v1/chat/completions"))


def _request_line(caplog) -> dict:
    [line] = [e for e in events(caplog) if e.get("path") == "/v1/chat/completions" and "status" in e]
    return line


async def test_json_completion_cancelled_by_the_runner_at_shutdown_is_not_a_client_disconnect(service: Service, caplog) -> None:
    service.litellm.next_scenarios.append("hang_before_headers")
    pending = asyncio.create_task(service.chat(chat_body()))
    await _upstream_asked(service)
    # What the runner does on SIGTERM: the app's shutdown, then its connections' shutdown,
    # which waits for the handler up to the timeout and then cancels it.
    await service.app.shutdown()
    await service.client.server.runner.server.shutdown(0.1)
    with pytest.raises(aiohttp.ClientError):
        await pending
    assert availability(service, "excluded", "server_shutdown") == 1
    assert availability(service, "abort", "client_disconnect") == 0
    line = _request_line(caplog)
    assert (line["event"], line["status"], line["result"]) == ("ended_by_shutdown", 503, "error")
    assert "client_disconnected" not in line


async def test_json_completion_abandoned_by_the_client_is_a_client_disconnect(service: Service, caplog) -> None:
    service.litellm.next_scenarios.append("hang_before_headers")
    pending = asyncio.create_task(service.chat(chat_body()))
    await _upstream_asked(service)
    pending.cancel()
    await wait_for(lambda: availability(service, "abort", "client_disconnect") == 1)
    assert availability(service, "excluded", "server_shutdown") == 0
    await asyncio.sleep(0.05)
    line = _request_line(caplog)
    assert (line["event"], line["status"], line["client_disconnected"]) == ("client_disconnected", 499, True)


async def test_lone_surrogates_are_stripped(service: Service) -> None:
    raw = b'{"model": "gpt-oss-120b", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    response = await service.client.post("/v1/chat/completions", data=raw, headers=service.headers())
    assert response.status == 200
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["messages"][0]["content"] == "ab"


async def test_message_content_never_logged(service: Service, caplog) -> None:
    secret_text = "my-private-diary-entry"
    await service.chat(chat_body(messages=[{"role": "user", "content": secret_text}]))
    assert secret_text not in caplog.text
    assert service.token not in caplog.text
    assert "request" in [e["event"] for e in events(caplog)]


async def test_request_too_large_by_content_length(make_service) -> None:
    service = await make_service(MAX_REQUEST_SIZE_BYTES="100")
    body = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * 200}]))
    response = await service.client.post("/v1/chat/completions", data=body, headers=service.headers())
    assert response.status == 413 and await response.json() == {"error": 3}
    search = await service.client.post("/v1/search", data=body, headers=service.headers())
    assert search.status == 413 and await search.json() == {"detail": {"error": 3}}


async def test_chunked_body_of_exactly_the_limit_is_accepted(make_service) -> None:
    """The limit is inclusive, as for Content-Length (compatibility.md §5.1: equal is allowed)."""
    limit = 400
    service = await make_service(MAX_REQUEST_SIZE_BYTES=str(limit))
    body = json.dumps(chat_body()).encode()
    body += b" " * (limit - len(body))  # JSON allows trailing whitespace

    async def chunks():
        for start in range(0, limit, 64):
            yield body[start : start + 64]

    response = await service.client.post("/v1/chat/completions", data=chunks(), headers=service.headers())
    assert response.request_info.headers.get("Transfer-Encoding") == "chunked"
    assert response.status == 200, await response.text()


async def test_request_too_large_when_chunked(make_service) -> None:
    service = await make_service(MAX_REQUEST_SIZE_BYTES="100")

    async def chunks():
        for _ in range(10):
            yield b"x" * 50

    response = await service.client.post("/v1/chat/completions", data=chunks(), headers=service.headers())
    assert response.status == 413 and await response.json() == {"error": 3}
    assert response.headers["X-Content-Type-Options"] == "nosniff"
