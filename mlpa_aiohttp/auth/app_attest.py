"""iOS App Attest: challenges, attestation (key registration) and per-request assertions
(compatibility.md §1.4, §2.5; D11, D14).

This module does the I/O and maps outcomes to the reference's statuses; the cryptography
is pure, in `app_attest_crypto`.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import cbor2
import structlog
from cryptography import x509

from ..errors import AuthRejected, BadRequest, Forbidden, ServerFault
from ..models import ProxyHeaders
from ..observability.metrics import Metrics
from ..settings import AppAttestSettings
from ..store.app_attest import ChallengeStore, PublicKeyStore
from ..store.base import StoreUnavailable
from .app_attest_crypto import (
    AssertionInvalid,
    AttestationInvalid,
    StoredKeyInvalid,
    load_root,
    production_root,
    sha256,
    verify_assertion,
    verify_attestation,
)
from .envelope import (
    ASSERTION_CLAIMS,
    ATTESTATION_CLAIMS,
    Base64Invalid,
    EnvelopeInvalid,
    decode_base64,
    decode_envelope,
    is_plausible_key_id,
)

log = structlog.get_logger(__name__)

MISSING_KEY_ID = "Bad Request: missing key_id_b64"
INVALID_KEY_ID = "Bad Request: invalid key_id_b64"
INVALID_ATTEST = "Invalid App attest"
INVALID_ASSERT = "Invalid App assert"
INVALID_CHALLENGE = "Invalid or expired challenge"
ATTESTATION_FAILED = "Attestation verification failed"
INVALID_ASSERTION = "Invalid App Attest assertion"
ASSERTION_SERVER_ERROR = "Server error during App Attest auth"


class AttestationRoots:
    """The production root (Apple's, or a configured one) and an optional QA root, which
    is used only when enabled and asked for by the request."""

    def __init__(self, settings: AppAttestSettings) -> None:
        self.production = (
            load_root(Path(settings.root_ca_path).read_bytes()) if settings.root_ca_path else production_root()
        )
        self.qa: x509.Certificate | None = None
        if settings.qa and settings.qa_root_ca_path:
            self.qa = load_root(Path(settings.qa_root_ca_path).read_bytes())

    def select(self, use_qa: bool) -> tuple[x509.Certificate, bool]:
        """The root to verify against, and whether it is the QA root (which also accepts
        the reference's QA tooling's objects, compatibility.md D54)."""
        if use_qa and self.qa is not None:
            log.warning("app_attest_qa_root_used")
            return self.qa, True
        return self.production, False


def _decode(text: str, field: str) -> bytes:
    try:
        return decode_base64(text)
    except Base64Invalid:
        raise BadRequest({field: "Invalid Base64"}) from None


class AppAttest:
    def __init__(
        self,
        *,
        challenges: ChallengeStore,
        keys: PublicKeyStore,
        settings: AppAttestSettings,
        metrics: Metrics,
    ) -> None:
        self._challenges = challenges
        self._keys = keys
        self._settings = settings
        self._metrics = metrics
        self._roots = AttestationRoots(settings)

    def _app_id(self, bundle_id: str) -> str:
        # APP_ATTEST_ENABLED=false: no app id is ours, as for a bundle id outside the allowlist.
        if not self._settings.enabled or (self._settings.bundle_ids and bundle_id not in self._settings.bundle_ids):
            raise Forbidden(ATTESTATION_FAILED)
        return f"{self._settings.development_team}.{bundle_id}"

    def _tolerate_app_id_mismatch(self, exc: AssertionInvalid, assertion_object: bytes, stored_counter: int) -> int:
        """`APP_ATTEST_CHECK_ASSERTION_APP_ID=false` (a transition, compatibility.md
        D25): accept an assertion for another app id than the request names, as the
        reference did; every other check stands. `verify_assertion` reports the app id
        only after the signature held (pinned by test_device_auth_routes), so the counter
        read here is signed."""
        if exc.reason != "rp_id_mismatch" or self._settings.check_assertion_app_id:
            raise exc
        authenticator_data = cbor2.loads(assertion_object)["authenticatorData"]
        counter = int.from_bytes(authenticator_data[33:37], "big")  # rpIdHash(32) flags(1) counter(4)
        if counter <= stored_counter:
            raise AssertionInvalid("counter_not_increasing")
        log.warning("app_attest_assertion_app_id_mismatch_accepted")
        return counter

    # -- GET /verify/challenge -------------------------------------------------------------
    async def issue_challenge(self, raw_key_id: str) -> str:
        if raw_key_id == "":
            raise BadRequest(MISSING_KEY_ID)
        # iOS clients send `+` unencoded, which a query string turns into a space.
        key_id_b64 = raw_key_id.replace(" ", "+")
        if not is_plausible_key_id(key_id_b64):
            raise BadRequest(INVALID_KEY_ID)
        try:
            return await self._challenges.issue(key_id_b64)
        except StoreUnavailable as exc:
            log.error("app_attest_challenge_store_failed", reason=str(exc))
            raise ServerFault("Challenge could not be issued") from None

    async def _consume_challenge(self, key_id_b64: str, challenge_b64: str) -> None:
        challenge = _decode(challenge_b64, "challenge_b64")
        started = time.monotonic()
        result = "error"
        try:
            try:
                text = challenge.decode("utf-8")
            except UnicodeDecodeError:
                raise AuthRejected(INVALID_CHALLENGE) from None
            if not await self._challenges.consume(key_id_b64, text):
                raise AuthRejected(INVALID_CHALLENGE)
            result = "success"
        except StoreUnavailable:
            raise ServerFault(ASSERTION_SERVER_ERROR) from None
        finally:
            self._metrics.challenge_latency.labels(result).observe(time.monotonic() - started)

    # -- POST /verify/attest ---------------------------------------------------------------
    async def attest(self, authorization: str, *, use_qa: bool) -> None:
        try:
            claims = decode_envelope(authorization, ATTESTATION_CLAIMS)
        except EnvelopeInvalid:
            raise AuthRejected(INVALID_ATTEST) from None
        key_id_b64 = claims["key_id_b64"]
        if not is_plausible_key_id(key_id_b64):
            raise BadRequest(INVALID_KEY_ID)
        await self._consume_challenge(key_id_b64, claims["challenge_b64"])
        attestation_object = _decode(claims["attestation_obj_b64"], "attestation_obj_b64")
        key_id = _decode(key_id_b64, "key_id_b64")
        # The reference's clients attest over SHA-256(challenge bytes), not the raw bytes
        # Apple's samples use; the request path keeps the reference's derivation.
        client_data_hash = sha256(decode_base64(claims["challenge_b64"]))
        app_id = self._app_id(claims["bundle_id"])
        root, qa_tooling = self._roots.select(use_qa)
        started = time.monotonic()
        try:
            # Chain verification is a few milliseconds of CPU: keep it off the loop.
            attested = await asyncio.to_thread(
                verify_attestation,
                attestation_object=attestation_object,
                client_data_hash=client_data_hash,
                key_id=key_id,
                app_id=app_id,
                production=self._settings.production,
                root=root,
                now=datetime.now(UTC),
                qa_tooling=qa_tooling,
            )
        except AttestationInvalid as exc:
            self._metrics.app_attest_latency.labels("error").observe(time.monotonic() - started)
            log.info("app_attest_attestation_rejected", reason=exc.reason)
            raise Forbidden(ATTESTATION_FAILED) from None
        self._metrics.app_attest_latency.labels("success").observe(time.monotonic() - started)
        try:
            await self._keys.store_key(key_id_b64, attested.public_key_pem, attested.counter)
        except StoreUnavailable:
            # compatibility.md D14: a key we could not store must not be reported as registered.
            log.error("app_attest_key_store_failed")
            raise ServerFault("Attested key could not be stored") from None

    # -- assertion on the proxy routes (DeviceAuthenticator) ---------------------------------
    async def base_identity(self, headers: ProxyHeaders, raw_body: bytes) -> str:
        try:
            claims = decode_envelope(headers.authorization, ASSERTION_CLAIMS)
        except EnvelopeInvalid:
            raise AuthRejected(INVALID_ASSERT) from None
        key_id_b64 = claims["key_id_b64"]
        if not is_plausible_key_id(key_id_b64):
            raise AuthRejected(INVALID_ASSERTION)
        client_data_hash = sha256(raw_body)
        await self._consume_challenge(key_id_b64, claims["challenge_b64"])
        assertion_object = _decode(claims["assertion_obj_b64"], "assertion_obj_b64")
        app_id = self._app_id(claims["bundle_id"])
        try:
            stored = await self._keys.get_key(key_id_b64)
        except StoreUnavailable:
            raise ServerFault(ASSERTION_SERVER_ERROR) from None
        if stored is None:
            raise AuthRejected(INVALID_ASSERTION)
        public_key_pem, stored_counter = stored
        started = time.monotonic()
        result = "error"
        try:
            try:
                new_counter = verify_assertion(
                    assertion_object=assertion_object,
                    client_data_hash=client_data_hash,
                    public_key_pem=public_key_pem,
                    app_id=app_id,
                    stored_counter=stored_counter,
                )
            except AssertionInvalid as exc:
                new_counter = self._tolerate_app_id_mismatch(exc, assertion_object, stored_counter)
            # compatibility.md D14: one conditional UPDATE decides between concurrent replays.
            if not await self._keys.advance_counter(key_id_b64, new_counter):
                raise AssertionInvalid("counter_not_increasing")
            result = "success"
        except AssertionInvalid as exc:
            log.info("app_attest_assertion_rejected", reason=exc.reason)
            raise AuthRejected(INVALID_ASSERTION) from None
        except (StoredKeyInvalid, StoreUnavailable):
            log.error("app_attest_assertion_server_error")
            raise ServerFault(ASSERTION_SERVER_ERROR) from None
        finally:
            self._metrics.app_assert_latency.labels(result).observe(time.monotonic() - started)
        return key_id_b64
