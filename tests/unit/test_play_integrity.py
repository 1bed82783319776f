"""Play Integrity verdict checks, our HS256 access token, and the Google client vs the fake."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import aiohttp
import google.auth.credentials
import jwt
import pytest
from google.oauth2 import service_account

from mlpa_aiohttp.auth.access_token import AccessTokenInvalid, issue_access_token, verify_access_token
from mlpa_aiohttp.auth.play_integrity import (
    MSG_APP_NOT_RECOGNIZED,
    MSG_DEVICE_INTEGRITY,
    MSG_INVALID_PACKAGE,
    MSG_INVALID_REQUEST_HASH,
    MSG_INVALID_TOKEN,
    MSG_STALE_VERDICT,
    VerdictRejected,
    check_verdict,
    is_plausible_integrity_token,
)
from mlpa_aiohttp.upstream.google import (
    PLAY_INTEGRITY_SCOPE,
    GoogleAccessTokenProvider,
    GoogleCredentialsUnavailable,
    PlayIntegrityHttpError,
    PlayIntegrityUnavailable,
    decode_integrity_token,
)
from tests.support.fake_google import FakeGoogle, make_verdict

USER_ID = "test-user-id"
ALLOWED = frozenset({"org.mozilla.fenix", "org.mozilla.fenix.debug", "org.mozilla.firefox", "org.mozilla.firefox_beta"})
NOW_MS = 1_750_000_000_000
SECRET = "an-access-token-secret-long-enough-for-hs512-" + "x" * 24


def check(verdict: Any, *, debug: bool = False, user_id: str = USER_ID, now_ms: int = NOW_MS) -> None:
    check_verdict(verdict, user_id=user_id, allowed_packages=ALLOWED, debug=debug, now_ms=now_ms, max_age_seconds=300)


def rejection(verdict: Any, **kwargs: Any) -> VerdictRejected:
    with pytest.raises(VerdictRejected) as caught:
        check(verdict, **kwargs)
    return caught.value


# ------------------------------------------------------------------ token plausibility


@pytest.mark.parametrize(
    ("token", "plausible"),
    [
        ("eyJhbGciOi.abc-DEF_123", True),
        ("a" * 10_000, True),
        ("a" * 10_001, False),
        ("", False),
        ("abc+def", False),
        ("abc/def=", False),
        ("abc def", False),
        ("abc\n", False),
    ],
)
def test_integrity_token_plausibility(token: str, plausible: bool) -> None:
    assert is_plausible_integrity_token(token) is plausible


# ------------------------------------------------------------------------ verdicts


def test_good_verdict_passes() -> None:
    check(make_verdict(USER_ID, timestamp_ms=NOW_MS - 1000))


def test_legacy_token_payload_key_accepted() -> None:
    check(make_verdict(USER_ID, timestamp_ms=NOW_MS, payload_key="tokenPayload"))


def test_numeric_timestamp_accepted() -> None:
    verdict = make_verdict(USER_ID)
    verdict["tokenPayloadExternal"]["requestDetails"]["timestampMillis"] = NOW_MS
    check(verdict)


@pytest.mark.parametrize("response", [{}, {"something": 1}, {"tokenPayloadExternal": "x"}, [], None])
def test_missing_payload_rejected(response: Any) -> None:
    assert rejection(response).message == MSG_INVALID_TOKEN


@pytest.mark.parametrize("package", ["org.example.evil", "", "org.mozilla.firefox.fake"])
def test_package_not_allowed_rejected(package: str) -> None:
    assert rejection(make_verdict(USER_ID, package=package, timestamp_ms=NOW_MS)).message == MSG_INVALID_PACKAGE


def test_request_hash_of_other_user_rejected() -> None:
    verdict = make_verdict("someone-else", timestamp_ms=NOW_MS)
    assert rejection(verdict).message == MSG_INVALID_REQUEST_HASH


def test_request_hash_must_be_lowercase_hex() -> None:
    upper = hashlib.sha256(USER_ID.encode()).hexdigest().upper()
    verdict = make_verdict(USER_ID, request_hash=upper, timestamp_ms=NOW_MS)
    assert rejection(verdict).message == MSG_INVALID_REQUEST_HASH


def test_missing_request_hash_rejected() -> None:
    verdict = make_verdict(USER_ID, timestamp_ms=NOW_MS)
    del verdict["tokenPayloadExternal"]["requestDetails"]["requestHash"]
    assert rejection(verdict).message == MSG_INVALID_REQUEST_HASH


@pytest.mark.parametrize("app_verdict", ["UNRECOGNIZED_VERSION", "UNEVALUATED", ""])
def test_unrecognized_app_rejected(app_verdict: str) -> None:
    verdict = make_verdict(USER_ID, app_verdict=app_verdict, timestamp_ms=NOW_MS)
    assert rejection(verdict).message == MSG_APP_NOT_RECOGNIZED


def test_unrecognized_version_accepted_in_debug_only() -> None:
    verdict = make_verdict(USER_ID, app_verdict="UNRECOGNIZED_VERSION", timestamp_ms=NOW_MS)
    check(verdict, debug=True)
    assert rejection(make_verdict(USER_ID, app_verdict="UNEVALUATED", timestamp_ms=NOW_MS), debug=True).message == (
        MSG_APP_NOT_RECOGNIZED
    )


@pytest.mark.parametrize("device_verdicts", [(), ("MEETS_VIRTUAL_INTEGRITY",), ("meets_device_integrity",)])
def test_device_integrity_failure_rejected(device_verdicts: tuple[str, ...]) -> None:
    verdict = make_verdict(USER_ID, device_verdicts=device_verdicts, timestamp_ms=NOW_MS)
    assert rejection(verdict).message == MSG_DEVICE_INTEGRITY


@pytest.mark.parametrize("accepted", ["MEETS_BASIC_INTEGRITY", "MEETS_STRONG_INTEGRITY", "MEETS_DEVICE_INTEGRITY"])
def test_any_integrity_level_accepted(accepted: str) -> None:
    check(make_verdict(USER_ID, device_verdicts=("MEETS_VIRTUAL_INTEGRITY", accepted), timestamp_ms=NOW_MS))


def test_checks_run_in_reference_order() -> None:
    everything_wrong = make_verdict(
        "other", package="org.example", app_verdict="UNEVALUATED", device_verdicts=(), timestamp_ms=0
    )
    assert rejection(everything_wrong).message == MSG_INVALID_PACKAGE
    everything_wrong["tokenPayloadExternal"]["requestDetails"]["requestPackageName"] = "org.mozilla.fenix"
    assert rejection(everything_wrong).message == MSG_INVALID_REQUEST_HASH
    everything_wrong["tokenPayloadExternal"]["requestDetails"]["requestHash"] = hashlib.sha256(b"test-user-id").hexdigest()
    assert rejection(everything_wrong).message == MSG_APP_NOT_RECOGNIZED
    everything_wrong["tokenPayloadExternal"]["appIntegrity"]["appRecognitionVerdict"] = "PLAY_RECOGNIZED"
    assert rejection(everything_wrong).message == MSG_DEVICE_INTEGRITY
    everything_wrong["tokenPayloadExternal"]["deviceIntegrity"]["deviceRecognitionVerdict"] = ["MEETS_BASIC_INTEGRITY"]
    assert rejection(everything_wrong).message == MSG_STALE_VERDICT


@pytest.mark.parametrize(
    ("timestamp", "reason"),
    [
        (str(NOW_MS - 301_000), "too_old"),
        (NOW_MS - 3_600_000, "too_old"),
        (str(NOW_MS + 61_000), "timestamp_in_future"),
        (None, "timestamp_missing"),
        ("soon", "timestamp_missing"),
        ("-5", "timestamp_missing"),
        (True, "timestamp_missing"),
        (1.5e12, "timestamp_missing"),
    ],
)
def test_stale_or_undated_verdict_rejected(timestamp: Any, reason: str) -> None:
    verdict = make_verdict(USER_ID)
    details = verdict["tokenPayloadExternal"]["requestDetails"]
    if timestamp is None:
        del details["timestampMillis"]
    else:
        details["timestampMillis"] = timestamp
    rejected = rejection(verdict)
    assert rejected.message == MSG_STALE_VERDICT
    assert rejected.reason == reason


@pytest.mark.parametrize("offset_ms", [-300_000, 0, 60_000])
def test_freshness_boundaries_accepted(offset_ms: int) -> None:
    check(make_verdict(USER_ID, timestamp_ms=NOW_MS + offset_ms))


# -------------------------------------------------------------------- access token

T0 = 1_750_000_000


def test_access_token_round_trip() -> None:
    token = issue_access_token(SECRET, USER_ID, 86400, T0)
    assert verify_access_token(SECRET, token, now=T0 + 100) == USER_ID
    claims = jwt.decode(token, SECRET, algorithms=["HS256"], options={"verify_exp": False})
    assert claims == {"iss": "mlpa", "sub": USER_ID, "iat": T0, "exp": T0 + 86400, "typ": "mlpa_access"}
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


def test_access_token_verified_against_wall_clock_by_default() -> None:
    assert verify_access_token(SECRET, issue_access_token(SECRET, USER_ID, 60, time.time())) == USER_ID
    with pytest.raises(AccessTokenInvalid):
        verify_access_token(SECRET, issue_access_token(SECRET, USER_ID, 60, time.time() - 3600))


def test_access_token_expiry_has_five_second_leeway() -> None:
    token = issue_access_token(SECRET, USER_ID, 60, T0)
    assert verify_access_token(SECRET, token, now=T0 + 65) == USER_ID
    with pytest.raises(AccessTokenInvalid):
        verify_access_token(SECRET, token, now=T0 + 66)


def _signed(claims: dict[str, Any], *, key: str = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm)


VALID_CLAIMS = {"iss": "mlpa", "sub": USER_ID, "iat": T0, "exp": T0 + 60, "typ": "mlpa_access"}


@pytest.mark.parametrize(
    "token",
    [
        _signed({**VALID_CLAIMS, "iss": "someone-else"}),
        _signed({**VALID_CLAIMS, "typ": "refresh"}),
        _signed({k: v for k, v in VALID_CLAIMS.items() if k != "typ"}),
        _signed({k: v for k, v in VALID_CLAIMS.items() if k != "exp"}),
        _signed({k: v for k, v in VALID_CLAIMS.items() if k != "sub"}),
        _signed({k: v for k, v in VALID_CLAIMS.items() if k != "iss"}),
        _signed({**VALID_CLAIMS, "sub": ""}),
        _signed({**VALID_CLAIMS, "exp": "tomorrow"}),
        _signed(VALID_CLAIMS, key="a-different-secret-" + "y" * 50),
        _signed(VALID_CLAIMS, algorithm="HS512"),
        _signed(VALID_CLAIMS, key="", algorithm="none"),
        _signed(VALID_CLAIMS)[:-2] + "xx",
        "not-a-jwt",
        "",
    ],
    ids=[
        "wrong-iss",
        "wrong-typ",
        "no-typ",
        "no-exp",
        "no-sub",
        "no-iss",
        "empty-sub",
        "exp-not-a-number",
        "bad-signature",
        "hs512",
        "alg-none",
        "tampered-signature",
        "garbage",
        "empty",
    ],
)
def test_invalid_access_tokens_rejected(token: str) -> None:
    with pytest.raises(AccessTokenInvalid):
        verify_access_token(SECRET, token, now=T0)


def test_valid_claims_fixture_itself_verifies() -> None:
    """Guards the table above: each rejection is due to its one defect."""
    assert verify_access_token(SECRET, _signed(VALID_CLAIMS), now=T0) == USER_ID


# ---------------------------------------------------------- Google client vs the fake


@pytest.fixture
async def fake_google(google_service_account_key) -> AsyncIterator[FakeGoogle]:
    fake = FakeGoogle(private_key=google_service_account_key)
    async with fake.serve():
        yield fake


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session


@pytest.fixture
def provider(fake_google: FakeGoogle, tmp_path: Path) -> Iterator[GoogleAccessTokenProvider]:
    key_file = fake_google.write_service_account_file(tmp_path / "service-account.json")
    token_provider = GoogleAccessTokenProvider(str(key_file))
    yield token_provider
    token_provider.close()


async def test_token_obtained_via_service_account_flow_and_cached(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider
) -> None:
    first = await provider.get_token()
    assert first in fake_google.issued_tokens
    assert fake_google.token_calls == 1
    form = fake_google.token_requests[0].body
    assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    assertion_claims = jwt.decode(form["assertion"], options={"verify_signature": False})
    assert assertion_claims["scope"] == PLAY_INTEGRITY_SCOPE
    assert await provider.get_token() == first
    assert fake_google.token_calls == 1


async def test_concurrent_callers_share_one_refresh(fake_google: FakeGoogle, provider: GoogleAccessTokenProvider) -> None:
    tokens = await asyncio.gather(*(provider.get_token() for _ in range(10)))
    assert len(set(tokens)) == 1
    assert fake_google.token_calls == 1


async def test_token_refreshed_when_close_to_expiry(fake_google: FakeGoogle, provider: GoogleAccessTokenProvider) -> None:
    fake_google.expires_in = 200  # inside the 300 s refresh margin: never worth caching
    first = await provider.get_token()
    second = await provider.get_token()
    assert first != second
    assert fake_google.token_calls == 2


async def test_invalidate_forces_new_token(fake_google: FakeGoogle, provider: GoogleAccessTokenProvider) -> None:
    await provider.get_token()
    provider.invalidate()
    await provider.get_token()
    assert fake_google.token_calls == 2


async def test_credentials_object_accepted(fake_google: FakeGoogle) -> None:
    credentials = service_account.Credentials.from_service_account_info(
        fake_google.service_account_info(), scopes=[PLAY_INTEGRITY_SCOPE]
    )
    token_provider = GoogleAccessTokenProvider(credentials)
    try:
        assert await token_provider.get_token() in fake_google.issued_tokens
    finally:
        token_provider.close()


async def test_token_endpoint_rejects_assertion_from_unknown_key(fake_google: FakeGoogle, tmp_path: Path) -> None:
    impostor = FakeGoogle()
    impostor.client_email = fake_google.client_email
    key_file = impostor.write_service_account_file(tmp_path / "impostor.json", base_url=fake_google.base_url)
    token_provider = GoogleAccessTokenProvider(str(key_file))
    try:
        with pytest.raises(GoogleCredentialsUnavailable):
            await token_provider.get_token()
    finally:
        token_provider.close()
    assert fake_google.issued_tokens == set()


async def test_missing_key_file_is_credentials_unavailable(tmp_path: Path) -> None:
    with pytest.raises(GoogleCredentialsUnavailable):
        await GoogleAccessTokenProvider(str(tmp_path / "absent.json")).get_token()


async def test_decode_returns_registered_verdict(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession
) -> None:
    verdict = make_verdict(USER_ID)
    fake_google.verdicts["tok-1"] = verdict
    result = await decode_integrity_token(
        session,
        integrity_token="tok-1",
        package_name="org.mozilla.firefox",
        access_token=await provider.get_token(),
        api_base=fake_google.base_url or "",
        quota_project="my-quota-project",
        timeout_seconds=5,
    )
    assert result == verdict
    recorded = fake_google.decode_requests[-1]
    assert recorded.path == "/v1/org.mozilla.firefox:decodeIntegrityToken"
    assert recorded.body == {"integrity_token": "tok-1"}
    assert recorded.headers["x-goog-user-project"] == "my-quota-project"
    assert recorded.headers["Authorization"].startswith("Bearer ya29.fake-")


async def test_decode_without_quota_project_sends_no_header(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession
) -> None:
    fake_google.verdicts["tok-1"] = make_verdict(USER_ID)
    await decode_integrity_token(
        session,
        integrity_token="tok-1",
        package_name="org.mozilla.fenix",
        access_token=await provider.get_token(),
        api_base=fake_google.base_url or "",
    )
    assert "x-goog-user-project" not in fake_google.decode_requests[-1].headers


@pytest.mark.parametrize("status", [400, 403])
async def test_unknown_integrity_token_is_http_error(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession, status: int
) -> None:
    fake_google.unknown_token_status = status
    with pytest.raises(PlayIntegrityHttpError) as caught:
        await decode_integrity_token(
            session,
            integrity_token="never-registered",
            package_name="org.mozilla.firefox",
            access_token=await provider.get_token(),
            api_base=fake_google.base_url or "",
        )
    assert caught.value.status == status
    assert caught.value.upstream_message


async def test_unissued_bearer_token_is_http_error(fake_google: FakeGoogle, session: aiohttp.ClientSession) -> None:
    fake_google.verdicts["tok-1"] = make_verdict(USER_ID)
    with pytest.raises(PlayIntegrityHttpError) as caught:
        await decode_integrity_token(
            session,
            integrity_token="tok-1",
            package_name="org.mozilla.firefox",
            access_token="ya29.made-up",
            api_base=fake_google.base_url or "",
        )
    assert caught.value.status == 401


async def test_google_500_is_http_error(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession
) -> None:
    fake_google.fail_with_500 = True
    with pytest.raises(PlayIntegrityHttpError) as caught:
        await decode_integrity_token(
            session,
            integrity_token="tok",
            package_name="org.mozilla.firefox",
            access_token=await provider.get_token(),
            api_base=fake_google.base_url or "",
        )
    assert caught.value.status == 500


async def test_connection_refused_is_transport_failure(session: aiohttp.ClientSession) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with pytest.raises(PlayIntegrityUnavailable):
        await decode_integrity_token(
            session,
            integrity_token="tok",
            package_name="org.mozilla.firefox",
            access_token="ya29.x",
            api_base=f"http://127.0.0.1:{closed_port}",
        )


async def test_dropped_connection_is_transport_failure(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession
) -> None:
    fake_google.drop_connection = True
    with pytest.raises(PlayIntegrityUnavailable):
        await decode_integrity_token(
            session,
            integrity_token="tok",
            package_name="org.mozilla.firefox",
            access_token=await provider.get_token(),
            api_base=fake_google.base_url or "",
        )


async def test_timeout_is_transport_failure(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession
) -> None:
    fake_google.decode_delay_seconds = 1
    fake_google.verdicts["tok"] = make_verdict(USER_ID)
    with pytest.raises(PlayIntegrityUnavailable):
        await decode_integrity_token(
            session,
            integrity_token="tok",
            package_name="org.mozilla.firefox",
            access_token=await provider.get_token(),
            api_base=fake_google.base_url or "",
            timeout_seconds=0.1,
        )


async def test_decoded_verdict_passes_checks_end_to_end(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession
) -> None:
    now_ms = int(time.time() * 1000)
    fake_google.verdicts["tok"] = make_verdict(USER_ID, package="org.mozilla.fenix", timestamp_ms=now_ms)
    response = await decode_integrity_token(
        session,
        integrity_token="tok",
        package_name="org.mozilla.fenix",
        access_token=await provider.get_token(),
        api_base=fake_google.base_url or "",
    )
    check(response, now_ms=now_ms)


async def test_non_object_response_is_transport_failure(
    fake_google: FakeGoogle, provider: GoogleAccessTokenProvider, session: aiohttp.ClientSession
) -> None:
    fake_google.verdicts["tok"] = ["not", "an", "object"]  # type: ignore[assignment]
    with pytest.raises(PlayIntegrityUnavailable):
        await decode_integrity_token(
            session,
            integrity_token="tok",
            package_name="org.mozilla.firefox",
            access_token=await provider.get_token(),
            api_base=fake_google.base_url or "",
        )


class _TokenlessCredentials(google.auth.credentials.Credentials):
    """Credentials whose refresh 'succeeds' without producing a token."""

    def refresh(self, request: Any) -> None:
        self.token = None


async def test_credentials_yielding_no_token_are_unavailable() -> None:
    with pytest.raises(GoogleCredentialsUnavailable):
        await GoogleAccessTokenProvider(_TokenlessCredentials()).get_token()


async def test_default_source_uses_application_default_credentials(
    fake_google: FakeGoogle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = fake_google.write_service_account_file(tmp_path / "adc.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    token_provider = GoogleAccessTokenProvider()
    try:
        assert await token_provider.get_token() in fake_google.issued_tokens
    finally:
        token_provider.close()
    assert fake_google.token_calls == 1
