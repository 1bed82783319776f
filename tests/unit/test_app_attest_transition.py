"""APP_ATTEST_CHECK_ASSERTION_APP_ID: the app-id check of iOS assertions (stricter than the
reference) can be relaxed during a client transition; every other check stands."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.app_attest_device import TestAttestationCA, compact_json

from ..conftest import Service, chat_body, events
from tests.support.device_service import BUNDLE, TEAM, attested_device, ca, challenge_for, google  # noqa: F401

OTHER_APP_ID = f"{TEAM}.org.mozilla.ios.FirefoxBeta"


async def make(make_service, ca: TestAttestationCA, tmp_path: Path, **env: str) -> Service:
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    return await make_service(APP_ATTEST_ROOT_CA_PATH=str(root), APP_DEVELOPMENT_TEAM=TEAM, **env)


async def post(service: Service, token: str, raw: bytes):
    headers = {"authorization": f"Bearer {token}", "service-type": "ai", "use-app-attest": "true"}
    return await service.client.post("/v1/chat/completions", data=raw, headers=headers)


async def other_app_assertion(service: Service, device, counter: int, raw: bytes, **defects) -> str:
    challenge = await challenge_for(service, device.key_id_b64)
    return device.assertion_jwt(challenge, raw, counter, rp_id=OTHER_APP_ID, **defects)


async def test_by_default_an_assertion_for_another_app_id_is_401(make_service, ca, tmp_path) -> None:
    service = await make(make_service, ca, tmp_path)
    device = await attested_device(service, ca)
    raw = compact_json(chat_body())
    response = await post(service, await other_app_assertion(service, device, 1, raw), raw)
    assert (response.status, await response.json()) == (401, {"detail": "Invalid App Attest assertion"})


async def test_relaxed_accepts_it_once_per_counter_and_logs_it(make_service, ca, tmp_path, caplog) -> None:
    service = await make(make_service, ca, tmp_path, APP_ATTEST_CHECK_ASSERTION_APP_ID="false")
    device = await attested_device(service, ca)
    raw = compact_json(chat_body())
    response = await post(service, await other_app_assertion(service, device, 1, raw), raw)
    assert response.status == 200, await response.text()
    assert [e["level"] for e in events(caplog, "app_attest_assertion_app_id_mismatch_accepted")] == ["WARNING"]
    # The counter still has to increase.
    response = await post(service, await other_app_assertion(service, device, 1, raw), raw)
    assert response.status == 401
    assert (await post(service, await other_app_assertion(service, device, 2, raw), raw)).status == 200


@pytest.mark.parametrize("defect", ["wrong_key", "tampered_body"])
async def test_relaxed_still_needs_the_attested_key_and_the_signed_body(make_service, ca, tmp_path, defect) -> None:
    service = await make(make_service, ca, tmp_path, APP_ATTEST_CHECK_ASSERTION_APP_ID="false")
    device = await attested_device(service, ca)
    raw = compact_json(chat_body())
    token = await other_app_assertion(service, device, 1, raw, wrong_key=defect == "wrong_key")
    sent = compact_json(chat_body(temperature=0.9)) if defect == "tampered_body" else raw
    response = await post(service, token, sent)
    assert (response.status, await response.json()) == (401, {"detail": "Invalid App Attest assertion"})
