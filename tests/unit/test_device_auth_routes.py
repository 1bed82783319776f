"""App Attest and Play Integrity through the service over HTTP (compatibility.md §1.4, §1.5, §2.5, §2.6).

The verifier runs for real: the test device produces genuine attestation and assertion
objects under a test CA whose root the service is configured with; Google is a loopback
fake speaking the OAuth token and decodeIntegrityToken protocols.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import jwt
import pytest

from mlpa_aiohttp import keys
from mlpa_aiohttp.auth.access_token import issue_access_token
from tests.support.app_attest_device import TestAttestationCA, TestDevice, compact_json
from tests.support.device_service import BUNDLE, TEAM, attested_device, ca, challenge_for, google  # noqa: F401 (fixtures)
from tests.support.device_service import device_service as service  # noqa: F401 (fixture)
from tests.support.fake_google import FakeGoogle, make_verdict

from ..conftest import DEV_TOKEN, Service, chat_body

async def assert_chat(service: Service, device: TestDevice, counter: int, *, body: bytes | None = None, **headers: str):
    raw = body if body is not None else compact_json(chat_body(stream=True))
    challenge = await challenge_for(service, device.key_id_b64)
    token = device.assertion_jwt(challenge, raw, counter)
    merged = {"authorization": f"Bearer {token}", "service-type": "ai", "use-app-attest": "true", **headers}
    return await service.client.post("/v1/chat/completions", data=raw, headers=merged)


# -- challenges ---------------------------------------------------------------------------


async def test_challenge_is_reserved_while_fresh_and_spaces_become_plus(service: Service) -> None:
    first = await challenge_for(service, "abc+def=")
    assert len(first) == 64 and int(first, 16) >= 0
    assert await challenge_for(service, "abc def=") == first


@pytest.mark.parametrize(
    "query,status,body",
    [
        ({"key_id_b64": ""}, 400, {"detail": "Bad Request: missing key_id_b64"}),
        ({"key_id_b64": "x'; DROP TABLE challenges;--"}, 400, {"detail": "Bad Request: invalid key_id_b64"}),
        ({"key_id_b64": "a" * 129}, 400, {"detail": "Bad Request: invalid key_id_b64"}),
    ],
)
async def test_challenge_rejects_implausible_key_ids(service: Service, query: dict, status: int, body: dict) -> None:
    response = await service.client.get("/verify/challenge", params=query)
    assert (response.status, await response.json()) == (status, body)


async def test_challenge_requires_the_parameter_and_get(service: Service) -> None:
    assert (await service.client.get("/verify/challenge")).status == 422
    assert (await service.client.post("/verify/challenge")).status == 405


# -- attestation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "defect",
    [{"wrong_nonce": True}, {"wrong_rp_id": True}, {"counter": 1}, {"wrong_key_id": True}, {"foreign_ca": True}],
    ids=lambda d: next(iter(d)),
)
async def test_attestation_defects_are_403(service: Service, ca: TestAttestationCA, defect: dict) -> None:
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    response = await service.client.post(
        "/verify/attest", headers={"authorization": f"Bearer {device.attestation_jwt(challenge, **defect)}"}
    )
    assert response.status == 403
    assert await response.json() == {"detail": "Attestation verification failed"}


async def test_development_aaguid_rejected_in_production(make_service, ca: TestAttestationCA, tmp_path: Path) -> None:
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    service = await make_service(APP_ATTEST_ROOT_CA_PATH=str(root), APP_DEVELOPMENT_TEAM=TEAM, APP_ATTEST_PRODUCTION="true")
    device = TestDevice(ca, TEAM, BUNDLE, production=False)
    challenge = await challenge_for(service, device.key_id_b64)
    response = await service.client.post("/verify/attest", headers={"authorization": device.attestation_jwt(challenge)})
    assert response.status == 403


async def test_attestation_challenge_is_single_use(service: Service, ca: TestAttestationCA) -> None:
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    token = device.attestation_jwt(challenge)
    assert (await service.client.post("/verify/attest", headers={"authorization": token})).status == 201
    replay = await service.client.post("/verify/attest", headers={"authorization": token})
    assert (replay.status, await replay.json()) == (401, {"detail": "Invalid or expired challenge"})


async def test_attestation_envelope_and_base64_errors(service: Service, ca: TestAttestationCA) -> None:
    unparseable = await service.client.post("/verify/attest", headers={"authorization": "Bearer not-a-jwt"})
    assert (unparseable.status, await unparseable.json()) == (401, {"detail": "Invalid App attest"})
    missing = await service.client.post("/verify/attest")
    assert missing.status == 422
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    claims = json.loads(base64.urlsafe_b64decode(device.attestation_jwt(challenge).split(".")[1] + "=="))
    claims["attestation_obj_b64"] = "***"
    bad = jwt.encode(claims, "envelope-signatures-are-ignored-anyway", algorithm="HS256")
    response = await service.client.post("/verify/attest", headers={"authorization": bad})
    assert (response.status, await response.json()) == (400, {"detail": {"attestation_obj_b64": "Invalid Base64"}})


# -- assertion on the proxy routes -------------------------------------------------------------


async def test_streaming_completion_with_app_attest(service: Service, ca: TestAttestationCA) -> None:
    device = await attested_device(service, ca)
    response = await assert_chat(service, device, 1)
    assert response.status == 200
    assert (await response.read()).endswith(b"data: [DONE]\n\n")
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["user"] == f"{device.key_id_b64}:ai"
    assert (await assert_chat(service, device, 2)).status == 200


@pytest.mark.parametrize("counter", [0, 1])
async def test_assertion_counter_must_increase(service: Service, ca: TestAttestationCA, counter: int) -> None:
    device = await attested_device(service, ca)
    assert (await assert_chat(service, device, 1)).status == 200
    response = await assert_chat(service, device, counter)
    assert (response.status, await response.json()) == (401, {"detail": "Invalid App Attest assertion"})


async def test_tampered_body_and_wrong_key_are_401(service: Service, ca: TestAttestationCA) -> None:
    device = await attested_device(service, ca)
    challenge = await challenge_for(service, device.key_id_b64)
    signed = compact_json(chat_body())
    token = device.assertion_jwt(challenge, signed, 1)
    tampered = compact_json(chat_body(model="gpt-oss-120b", temperature=0.9))
    headers = {"authorization": token, "service-type": "ai", "use-app-attest": "true"}
    response = await service.client.post("/v1/chat/completions", data=tampered, headers=headers)
    assert response.status == 401
    challenge = await challenge_for(service, device.key_id_b64)
    wrong_key = device.assertion_jwt(challenge, signed, 2, wrong_key=True)
    response = await service.client.post("/v1/chat/completions", data=signed, headers={**headers, "authorization": wrong_key})
    assert response.status == 401


async def test_replayed_assertion_challenge_is_401(service: Service, ca: TestAttestationCA) -> None:
    device = await attested_device(service, ca)
    raw = compact_json(chat_body())
    challenge = await challenge_for(service, device.key_id_b64)
    headers = {"authorization": device.assertion_jwt(challenge, raw, 1), "service-type": "ai", "use-app-attest": "true"}
    assert (await service.client.post("/v1/chat/completions", data=raw, headers=headers)).status == 200
    replay = await service.client.post("/v1/chat/completions", data=raw, headers=headers)
    assert (replay.status, await replay.json()) == (401, {"detail": "Invalid or expired challenge"})


async def test_concurrent_assertions_with_the_same_counter_one_wins(service: Service, ca: TestAttestationCA) -> None:
    device = await attested_device(service, ca)
    raw = compact_json(chat_body())
    challenge = await challenge_for(service, device.key_id_b64)
    headers = {"authorization": device.assertion_jwt(challenge, raw, 5), "service-type": "ai", "use-app-attest": "true"}
    responses = await asyncio.gather(
        *(service.client.post("/v1/chat/completions", data=raw, headers=headers) for _ in range(2))
    )
    assert sorted(r.status for r in responses) == [200, 401]


async def test_dev_service_type_needs_dev_key_on_app_attest(service: Service, ca: TestAttestationCA) -> None:
    device = await attested_device(service, ca)
    response = await assert_chat(service, device, 1, **{"service-type": "ai-dev"})
    assert response.status == 401
    ok = await assert_chat(service, device, 2, **{"service-type": "ai-dev", "x-dev-authorization": DEV_TOKEN})
    assert ok.status == 200


# -- Play Integrity ------------------------------------------------------------------------------


async def play(service: Service, body: dict, content_type: str = "application/json"):
    return await service.client.post("/verify/play", data=json.dumps(body), headers={"content-type": content_type})


async def test_play_token_round_trip_and_streaming_completion(service: Service, google: FakeGoogle) -> None:
    google.verdicts["integrity-token-1"] = make_verdict("android-user")
    response = await play(service, {"integrity_token": "integrity-token-1", "user_id": "android-user"}, "text/plain")
    assert response.status == 200
    grant = await response.json()
    assert grant["token_type"] == "Bearer" and grant["expires_in"] == 86400
    chat = await service.chat(
        chat_body(stream=True),
        headers={"authorization": f"Bearer {grant['access_token']}", "service-type": "memories", "use-play-integrity": "1"},
    )
    assert chat.status == 200
    assert (await chat.read()).endswith(b"data: [DONE]\n\n")
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["user"] == "android-user:memories"
    registry = service.app[keys.METRICS].registry
    assert registry.get_sample_value("mlpa_play_verifications_total") == 1
    assert registry.get_sample_value("mlpa_access_token_verifications_total") == 1


@pytest.mark.parametrize(
    "verdict,message",
    [
        (make_verdict("u", package="com.evil.app"), "Invalid package name"),
        (make_verdict("someone-else"), "Invalid request hash"),
        (make_verdict("u", app_verdict="UNRECOGNIZED_VERSION"), "App not recognized by Play"),
        (make_verdict("u", device_verdicts=()), "Device integrity check failed"),
        (make_verdict("u", timestamp_ms=1_000), "Stale Play Integrity verdict"),
    ],
)
async def test_play_verdict_failures(service: Service, google: FakeGoogle, verdict: dict, message: str) -> None:
    google.verdicts["tok"] = verdict
    response = await play(service, {"integrity_token": "tok", "user_id": "u"})
    assert (response.status, await response.json()) == (401, {"detail": message})


async def test_play_plausibility_rejects_without_calling_google(service: Service, google: FakeGoogle) -> None:
    response = await play(service, {"integrity_token": "not valid!", "user_id": "u"})
    assert (response.status, await response.json()) == (400, {"detail": "Invalid integrity_token"})
    colon = await play(service, {"integrity_token": "tok", "user_id": "a:b"})
    assert colon.status == 400
    assert not google.decode_requests and google.token_calls == 0


async def test_play_google_errors(service: Service, google: FakeGoogle) -> None:
    unknown = await play(service, {"integrity_token": "unknown-token", "user_id": "u"})
    assert (unknown.status, await unknown.json()) == (401, {"detail": {"error": "Upstream service returned an error"}})
    google.drop_connection = True
    down = await play(service, {"integrity_token": "tok", "user_id": "u"})
    assert (down.status, await down.json()) == (502, {"detail": {"error": "Play Integrity validation service unavailable"}})


async def test_play_package_not_allowed(service: Service) -> None:
    response = await play(service, {"integrity_token": "tok", "user_id": "u", "package_name": "com.other"})
    assert (response.status, await response.json()) == (403, {"detail": "Package name not allowed"})


async def test_google_token_is_cached(service: Service, google: FakeGoogle) -> None:
    google.verdicts["tok"] = make_verdict("u")
    for _ in range(3):
        assert (await play(service, {"integrity_token": "tok", "user_id": "u"})).status == 200
    assert google.token_calls == 1


async def test_invalid_and_expired_access_tokens(service: Service) -> None:
    settings = service.app[keys.SETTINGS]
    expired = issue_access_token(settings.auth.access_token_secret, "u", 60, 1_000_000)
    forged = issue_access_token("another-secret-that-is-long-enough-for-hs256", "u", 3600, time.time())
    for token in (expired, forged, "garbage"):
        response = await service.chat(headers={"authorization": f"Bearer {token}", "service-type": "ai", "use-play-integrity": "true"})
        assert (response.status, await response.json()) == (401, {"detail": "Invalid MLPA access token"})


async def test_dev_service_type_needs_dev_key_on_play(service: Service, google: FakeGoogle) -> None:
    google.verdicts["tok"] = make_verdict("u")
    grant = await (await play(service, {"integrity_token": "tok", "user_id": "u"})).json()
    headers = {"authorization": f"Bearer {grant['access_token']}", "service-type": "mochi-dev", "use-play-integrity": "true"}
    assert (await service.chat(headers=headers)).status == 401
    assert (await service.chat(headers={**headers, "x-dev-authorization": DEV_TOKEN})).status == 200

