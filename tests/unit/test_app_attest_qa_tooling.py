"""Attestations made by the reference's QA tooling (spec mlpa-1.0.39 §A.17;
compatibility.md §2.5, D54): accepted in QA mode only, i.e. against the configured QA root for a request that
sends `use-qa-certificates: true` with `APP_ATTEST_QA` on. Each relaxation is shown not to
apply outside that mode: the same object against Apple's root, or against the same root as
the production root.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import cbor2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from mlpa_aiohttp.auth.app_attest_crypto import (
    AttestationInvalid,
    production_root,
    sha256,
    verify_attestation,
)
from tests.support.app_attest_device import (
    APPLE_NONCE_PREFIX,
    QAToolingDevice,
    QAToolingRoot,
    compact_json,
)
from tests.support.device_service import BUNDLE, TEAM, challenge_for

from ..conftest import Service, chat_body, events

CHALLENGE = b"5e1f" * 16


@pytest.fixture(scope="module")
def qa_root() -> QAToolingRoot:
    return QAToolingRoot()


@pytest.fixture
def device(qa_root: QAToolingRoot) -> QAToolingDevice:
    return QAToolingDevice(qa_root, TEAM, BUNDLE)


def verify(device: QAToolingDevice, attestation_object: bytes, **overrides):
    arguments = {
        "attestation_object": attestation_object,
        "client_data_hash": sha256(CHALLENGE),
        "key_id": device.key_id,
        "app_id": device.app_id,
        "production": False,
        "root": device.qa_root.certificate,
        "now": datetime.now(UTC),
        "qa_tooling": True,
    }
    return verify_attestation(**{**arguments, **overrides})


def reason(device: QAToolingDevice, attestation_object: bytes, **overrides) -> str:
    with pytest.raises(AttestationInvalid) as caught:
        verify(device, attestation_object, **overrides)
    return caught.value.reason


# -- the pure verifier ------------------------------------------------------------------------


def test_the_qa_toolings_object_has_the_shape_the_spec_describes(device: QAToolingDevice) -> None:
    decoded = cbor2.loads(device.attest(CHALLENGE))
    leaf_der, root_der = decoded["attStmt"]["x5c"]
    assert decoded["attStmt"]["receipt"] == b""
    root = x509.load_der_x509_certificate(root_der)
    assert root == device.qa_root.certificate and isinstance(root.public_key(), rsa.RSAPublicKey)
    assert root.public_key().key_size == 2048
    with pytest.raises(x509.ExtensionNotFound):
        root.extensions.get_extension_for_class(x509.BasicConstraints)
    leaf = x509.load_der_x509_certificate(leaf_der)
    # RSA PKCS#1 v1.5 with SHA-256 by the root key: verify it the long way round.
    root.public_key().verify(leaf.signature, leaf.tbs_certificate_bytes, padding.PKCS1v15(), leaf.signature_hash_algorithm)
    auth_data = decoded["authData"]
    assert auth_data[32:37] == b"\x00" * 5  # flags 0x00, counter 0
    assert auth_data[37:53] == b"appattestdevelop"
    nonce_value = leaf.extensions.get_extension_for_oid(x509.ObjectIdentifier("1.2.840.113635.100.8.2")).value.value
    assert nonce_value == bytes(6) + sha256(auth_data + sha256(CHALLENGE))


def test_accepted_in_qa_mode_with_the_root_as_anchor(device: QAToolingDevice) -> None:
    attested = verify(device, device.attest(CHALLENGE))
    assert attested.public_key_pem == device.public_key_pem
    assert attested.counter == 0


def test_leaf_only_with_either_nonce_form_is_accepted_in_qa_mode(device: QAToolingDevice) -> None:
    assert verify(device, device.attest(CHALLENGE, leaf_only=True)).counter == 0
    assert verify(device, device.attest(CHALLENGE, leaf_only=True, nonce_prefix=APPLE_NONCE_PREFIX)).counter == 0


def test_the_root_in_x5c_is_refused_outside_qa_mode(device: QAToolingDevice) -> None:
    attestation_object = device.attest(CHALLENGE, nonce_prefix=APPLE_NONCE_PREFIX)
    # Same root, same object: only the mode differs. The root then counts as an
    # intermediate, and it carries no BasicConstraints.
    assert reason(device, attestation_object, qa_tooling=False) == "chain_invalid"
    assert reason(device, attestation_object, qa_tooling=False, root=production_root()) == "chain_invalid"
    # QA mode against another root does not trust the QA root found in x5c.
    assert reason(device, attestation_object, root=production_root()) == "chain_invalid"


def test_the_six_zero_byte_nonce_is_refused_outside_qa_mode(device: QAToolingDevice) -> None:
    leaf_only = device.attest(CHALLENGE, leaf_only=True)
    assert reason(device, leaf_only, qa_tooling=False) == "nonce_mismatch"
    # Apple's DER form, leaf only, verifies there (what the project accepted before).
    assert verify(device, device.attest(CHALLENGE, leaf_only=True, nonce_prefix=APPLE_NONCE_PREFIX), qa_tooling=False)


@pytest.mark.parametrize("prefix", [b"\x00" * 5 + b"\x01", bytes.fromhex("3024a1220400"), b"", bytes(7)])
def test_qa_mode_accepts_only_the_two_known_nonce_forms(device: QAToolingDevice, prefix: bytes) -> None:
    assert reason(device, device.attest(CHALLENGE, nonce_prefix=prefix)) == "nonce_mismatch"


def test_qa_mode_still_binds_the_nonce_to_the_challenge(device: QAToolingDevice) -> None:
    assert reason(device, device.attest(CHALLENGE), client_data_hash=sha256(b"another challenge")) == "nonce_mismatch"


def test_only_a_byte_equal_copy_of_the_root_is_dropped(device: QAToolingDevice) -> None:
    # Another QA root with the same name and profile is no anchor: it stays an intermediate,
    # which did not sign the leaf.
    impostor = QAToolingRoot().certificate
    assert impostor.subject == device.qa_root.certificate.subject
    assert reason(device, device.attest(CHALLENGE, extra_certificate=impostor)) == "chain_invalid"


def test_production_aaguid_rule_still_applies_in_qa_mode(device: QAToolingDevice) -> None:
    assert reason(device, device.attest(CHALLENGE), production=True) == "aaguid_mismatch"


# -- over HTTP ----------------------------------------------------------------------------------


@pytest.fixture
def qa_root_file(qa_root: QAToolingRoot, tmp_path: Path) -> Path:
    path = tmp_path / "qa-root.pem"
    path.write_bytes(qa_root.root_pem)
    return path


async def attest(service: Service, device: QAToolingDevice, *, headers: dict[str, str] | None = None, **variant):
    challenge = await challenge_for(service, device.key_id_b64)
    token = device.attestation_jwt(challenge, **variant)
    return await service.client.post("/verify/attest", headers={"authorization": f"Bearer {token}", **(headers or {})})


async def completion(service: Service, device: QAToolingDevice, counter: int, *, stream: bool):
    raw = compact_json(chat_body(stream=stream))
    challenge = await challenge_for(service, device.key_id_b64)
    headers = {
        "authorization": f"Bearer {device.assertion_jwt(challenge, raw, counter)}",
        "service-type": "ai",
        "use-app-attest": "true",
        "use-qa-certificates": "true",
    }
    return await service.client.post("/v1/chat/completions", data=raw, headers=headers)


async def test_a_qa_tooling_attestation_registers_and_its_key_serves(
    make_service, qa_root_file: Path, device: QAToolingDevice, caplog
) -> None:
    service = await make_service(APP_ATTEST_QA="true", APP_ATTEST_QA_ROOT_CA_PATH=str(qa_root_file), APP_DEVELOPMENT_TEAM=TEAM)
    response = await attest(service, device, headers={"use-qa-certificates": "true"})
    assert (response.status, await response.json()) == (201, {"status": "success"})
    assert len(events(caplog, "app_attest_qa_root_used")) == 1

    streamed = await completion(service, device, 1, stream=True)
    assert streamed.status == 200
    assert (await streamed.read()).endswith(b"data: [DONE]\n\n")
    assert service.litellm.requests_to("/v1/chat/completions")[-1].json["user"] == f"{device.key_id_b64}:ai"
    whole = await completion(service, device, 2, stream=False)
    assert whole.status == 200
    assert (await whole.json())["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "environment,headers",
    [
        # QA mode on, but the request does not ask for it: Apple's root.
        ({"APP_ATTEST_QA": "true"}, {}),
        ({"APP_ATTEST_QA": "true"}, {"use-qa-certificates": "false"}),
        # The request asks, but QA mode is off: Apple's root.
        ({"APP_ATTEST_QA": "false"}, {"use-qa-certificates": "true"}),
    ],
    ids=["qa-on-not-asked", "qa-on-asked-false", "qa-off-asked"],
)
async def test_a_qa_tooling_attestation_is_403_outside_qa_mode(
    make_service, qa_root_file: Path, device: QAToolingDevice, environment: dict, headers: dict, caplog
) -> None:
    service = await make_service(**environment, APP_ATTEST_QA_ROOT_CA_PATH=str(qa_root_file), APP_DEVELOPMENT_TEAM=TEAM)
    response = await attest(service, device, headers=headers)
    assert (response.status, await response.json()) == (403, {"detail": "Attestation verification failed"})
    assert [line["reason"] for line in events(caplog, "app_attest_attestation_rejected")] == ["chain_invalid"]


async def test_the_qa_root_as_production_root_gets_no_relaxation(
    make_service, qa_root_file: Path, device: QAToolingDevice, caplog
) -> None:
    # The same root trusted as the production root: the relaxations belong to QA mode, not to the root.
    service = await make_service(APP_ATTEST_ROOT_CA_PATH=str(qa_root_file), APP_DEVELOPMENT_TEAM=TEAM)
    response = await attest(service, device)
    assert response.status == 403
    response = await attest(service, QAToolingDevice(device.qa_root, TEAM, BUNDLE), leaf_only=True)
    assert response.status == 403
    assert [line["reason"] for line in events(caplog, "app_attest_attestation_rejected")] == ["chain_invalid", "nonce_mismatch"]
