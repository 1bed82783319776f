"""Production refuses what could only fail iOS and Android requests later (compatibility.md
D63): a placeholder or missing Apple team id, no bundle-id list, no Google credentials. Every
problem is named in the one start-up error; `APP_ATTEST_ENABLED=false` and
`PLAY_INTEGRITY_ENABLED=false` run without a platform, and then its routes answer 403."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlpa_aiohttp.settings import Settings, SettingsError
from tests.support.app_attest_device import TestAttestationCA, TestDevice
from tests.support.device_service import BUNDLE, TEAM, ca, challenge_for, google  # noqa: F401 (fixtures)
from tests.support.fake_google import FakeGoogle, make_verdict

from ..conftest import TEST_KEYS, TEST_PLATFORMS, TEST_SECRETS

CREDENTIALS = TEST_PLATFORMS["PLAY_INTEGRITY_CREDENTIALS_FILE"]


def problems(environ: dict[str, str]) -> dict[str, str]:
    """Each problem of the production start by the variable it names."""
    with pytest.raises(SettingsError) as refused:
        Settings.from_environ(environ)
    return {problem.split(":", 1)[0]: problem for problem in refused.value.problems}


@pytest.fixture(autouse=True)
def _no_ambient_google_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine's own gcloud login or cloud must not decide the Play checks below."""
    monkeypatch.setattr("mlpa_aiohttp.settings._GCE_PRODUCT_NAME_FILE", str(tmp_path / "no-dmi"))


def test_the_keys_alone_name_every_platform_problem_at_once() -> None:
    found = problems(dict(TEST_KEYS))
    assert set(found) == {"APP_DEVELOPMENT_TEAM", "APP_ATTEST_BUNDLE_IDS", "PLAY_INTEGRITY_CREDENTIALS_FILE"}
    assert "APP_ATTEST_ENABLED=false" in found["APP_DEVELOPMENT_TEAM"]
    assert "`*` for any" in found["APP_ATTEST_BUNDLE_IDS"]
    assert "PLAY_INTEGRITY_ENABLED=false" in found["PLAY_INTEGRITY_CREDENTIALS_FILE"]


@pytest.mark.parametrize(
    ("team", "says"),
    [
        ("TEAMID1234", "still the placeholder"),  # the reference's default
        ("replace-with-apple-team-id", "still the placeholder"),  # the shipped ConfigMap's
        ("", "empty"),
        ("teamid1234", "is not an Apple team id"),
        ("ABC123", "is not an Apple team id"),
    ],
)
def test_a_team_id_that_cannot_match_an_app_is_refused(team: str, says: str) -> None:
    found = problems(TEST_SECRETS | {"APP_DEVELOPMENT_TEAM": team})
    assert set(found) == {"APP_DEVELOPMENT_TEAM"} and says in found["APP_DEVELOPMENT_TEAM"]


def test_bundle_ids_placeholder_is_refused_and_star_means_any() -> None:
    found = problems(TEST_SECRETS | {"APP_ATTEST_BUNDLE_IDS": "replace-with-ios-bundle-ids"})
    assert set(found) == {"APP_ATTEST_BUNDLE_IDS"}
    assert Settings.from_environ(TEST_SECRETS | {"APP_ATTEST_BUNDLE_IDS": "*"}).app_attest.bundle_ids == frozenset()
    listed = Settings.from_environ(TEST_SECRETS | {"APP_ATTEST_BUNDLE_IDS": "org.a,org.b"}).app_attest.bundle_ids
    assert listed == {"org.a", "org.b"}


def test_ios_off_needs_neither_team_nor_bundle_ids() -> None:
    environ = {k: v for k, v in TEST_SECRETS.items() if not k.startswith("APP_")} | {"APP_ATTEST_ENABLED": "false"}
    assert Settings.from_environ(environ).app_attest.enabled is False


def test_google_credentials_file_must_be_readable_json(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    found = problems(TEST_SECRETS | {"PLAY_INTEGRITY_CREDENTIALS_FILE": str(missing)})
    assert set(found) == {"PLAY_INTEGRITY_CREDENTIALS_FILE"} and "cannot read" in found["PLAY_INTEGRITY_CREDENTIALS_FILE"]
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    found = problems(TEST_SECRETS | {"PLAY_INTEGRITY_CREDENTIALS_FILE": str(garbage)})
    assert "is not JSON" in found["PLAY_INTEGRITY_CREDENTIALS_FILE"]


def test_application_default_credentials_are_found_without_a_network_call(tmp_path: Path) -> None:
    without_file = {k: v for k, v in TEST_SECRETS.items() if k != "PLAY_INTEGRITY_CREDENTIALS_FILE"}
    # GOOGLE_APPLICATION_CREDENTIALS: checked like the service's own variable.
    Settings.from_environ(without_file | {"GOOGLE_APPLICATION_CREDENTIALS": CREDENTIALS})
    found = problems(without_file | {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "absent.json")})
    assert set(found) == {"GOOGLE_APPLICATION_CREDENTIALS"}
    # gcloud's own file, under HOME.
    gcloud = tmp_path / ".config" / "gcloud"
    gcloud.mkdir(parents=True)
    (gcloud / "application_default_credentials.json").write_text(json.dumps({"type": "authorized_user"}))
    Settings.from_environ(without_file | {"HOME": str(tmp_path)})
    # A metadata server (google-auth's override variable): GKE workload identity, a VM.
    Settings.from_environ(without_file | {"GCE_METADATA_HOST": "169.254.169.254"})
    # None of them: refused.
    assert set(problems(without_file | {"HOME": str(tmp_path / "nobody")})) == {"PLAY_INTEGRITY_CREDENTIALS_FILE"}


def test_on_google_cloud_the_machine_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    product = tmp_path / "product_name"
    product.write_text("Google Compute Engine\n")
    monkeypatch.setattr("mlpa_aiohttp.settings._GCE_PRODUCT_NAME_FILE", str(product))
    without_file = {k: v for k, v in TEST_SECRETS.items() if k != "PLAY_INTEGRITY_CREDENTIALS_FILE"}
    Settings.from_environ(without_file)


def test_android_off_needs_no_credentials() -> None:
    environ = {k: v for k, v in TEST_SECRETS.items() if k != "PLAY_INTEGRITY_CREDENTIALS_FILE"}
    assert Settings.from_environ(environ | {"PLAY_INTEGRITY_ENABLED": "false"}).play.enabled is False


def test_debug_and_migrate_ask_for_none_of_it() -> None:
    Settings.from_environ({"MLPA_DEBUG": "true"})
    Settings.from_environ({}, check_secrets=False)


# -- a platform turned off, over HTTP -----------------------------------------------------


async def test_ios_off_refuses_attestation_with_403(make_service: Any, ca: TestAttestationCA, tmp_path: Path) -> None:
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    service = await make_service(APP_ATTEST_ROOT_CA_PATH=str(root), APP_DEVELOPMENT_TEAM=TEAM, APP_ATTEST_ENABLED="false")
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    response = await service.client.post(
        "/verify/attest", headers={"authorization": f"Bearer {device.attestation_jwt(challenge)}"}
    )
    assert (response.status, await response.json()) == (403, {"detail": "Attestation verification failed"})


async def test_android_off_refuses_verify_play_with_403_without_asking_google(
    make_service: Any, google: FakeGoogle
) -> None:
    service = await make_service(
        PLAY_INTEGRITY_API_BASE=google.base_url,
        PLAY_INTEGRITY_CREDENTIALS_FILE=str(google.credentials_file),
        PLAY_INTEGRITY_ENABLED="false",
    )
    google.verdicts["integrity-token-1"] = make_verdict("android-user")
    response = await service.client.post(
        "/verify/play", data=json.dumps({"integrity_token": "integrity-token-1", "user_id": "android-user"})
    )
    assert (response.status, await response.json()) == (403, {"detail": "Play Integrity is turned off"})
    assert google.token_calls == 0 and not google.decode_requests
