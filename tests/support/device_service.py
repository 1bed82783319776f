"""The service set up for device credentials: an App Attest test CA whose root it trusts, a
loopback fake Google for Play Integrity, and the steps a device takes (fetch a challenge,
attest a key). Imported as fixtures by the test modules that need them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.app_attest_device import TestAttestationCA, TestDevice
from tests.support.fake_google import FakeGoogle

TEAM = "TESTTEAM01"  # an Apple-shaped team id; TEAMID1234, the reference default, is refused outside debug
BUNDLE = "org.mozilla.ios.Firefox"


@pytest.fixture(scope="module")
def ca() -> TestAttestationCA:
    return TestAttestationCA()


@pytest.fixture
async def google(tmp_path: Path, google_service_account_key):
    fake = FakeGoogle(private_key=google_service_account_key)
    async with fake.serve():
        fake.credentials_file = fake.write_service_account_file(tmp_path / "sa.json")
        yield fake


@pytest.fixture
async def device_service(make_service, ca: TestAttestationCA, google: FakeGoogle, tmp_path: Path) -> Any:
    """The test `Service`, trusting the test CA and asking the fake Google."""
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    return await make_service(
        APP_ATTEST_ROOT_CA_PATH=str(root),
        APP_DEVELOPMENT_TEAM=TEAM,
        PLAY_INTEGRITY_API_BASE=google.base_url,
        PLAY_INTEGRITY_CREDENTIALS_FILE=str(google.credentials_file),
    )


async def challenge_for(service: Any, key_id_b64: str) -> str:
    response = await service.client.get("/verify/challenge", params={"key_id_b64": key_id_b64})
    assert response.status == 200
    return (await response.json())["challenge"]


async def attested_device(service: Any, ca: TestAttestationCA) -> TestDevice:
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    response = await service.client.post(
        "/verify/attest", headers={"authorization": f"Bearer {device.attestation_jwt(challenge)}"}
    )
    assert response.status == 201, await response.text()
    assert await response.json() == {"status": "success"}
    return device
