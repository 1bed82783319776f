"""Real Apple attestations and assertions through the verifier's pure core.

Every real object verifies at its `verify_at` (the leaf certificates have all expired
since) under its environment's AAGUID rule; single-byte changes to each part fail with
the reason that names what broke. Where a real vector and the verifier disagree, the
vector is right.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import cbor2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from mlpa_aiohttp.auth.app_attest_crypto import (
    AssertionInvalid,
    AttestationInvalid,
    production_root,
    verify_assertion,
    verify_attestation,
)
from tests.support.app_attest_device import TestAttestationCA

from .app_attest_vectors import VECTORS_ENV, RealAssertion, RealAttestation, load_vectors, vectors_dir

_FOLDER = vectors_dir()
if _FOLDER is None:
    pytest.skip(
        f"App Attest vectors not found: set {VECTORS_ENV} to their folder (appattest-vectors), "
        "or put it at shared/data/appattest-vectors beside the repository",
        allow_module_level=True,
    )

VECTORS = load_vectors(_FOLDER)
ROOT = production_root()
# authData field boundaries before the variable-length credential id (tested separately).
FIELDS = {"rp_id_hash": (0, 32), "flags": (32, 33), "counter": (33, 37), "aaguid": (37, 53), "credential_id_length": (53, 55)}


def by_name(vector: RealAttestation) -> str:
    return vector.name


def verify(vector: RealAttestation, attestation_object: bytes | None = None, **overrides):
    arguments = {
        "attestation_object": vector.attestation_object if attestation_object is None else attestation_object,
        "client_data_hash": vector.client_data_hash,
        "key_id": vector.key_id,
        "app_id": vector.app_id,
        "production": vector.production,
        "root": ROOT,
        "now": vector.verify_at,
    }
    return verify_attestation(**{**arguments, **overrides})


def reason_of(vector: RealAttestation, attestation_object: bytes | None = None, **overrides) -> str:
    try:
        verify(vector, attestation_object, **overrides)
    except AttestationInvalid as rejected:
        return rejected.reason
    return "accepted"


def flipped(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]


def decoded(vector: RealAttestation) -> dict:
    return cbor2.loads(vector.attestation_object)


def leaf_of(vector: RealAttestation) -> x509.Certificate:
    return x509.load_der_x509_certificate(decoded(vector)["attStmt"]["x5c"][0])


def with_part_flipped(vector: RealAttestation, part: bytes, offset: int) -> bytes:
    """The raw attestation object with one byte of `part` (found in place) changed; every
    other byte stays as Apple sent it."""
    raw = vector.attestation_object
    start = raw.index(part)
    return flipped(raw, start + offset)


def test_every_vector_is_found() -> None:
    assert len(VECTORS) >= 23
    assert sum(len(vector.assertions) for vector in VECTORS) >= 16
    environments = {vector.production for vector in VECTORS}
    assert environments == {True, False}


# ------------------------------------------------------------------------ acceptance


@pytest.mark.parametrize("vector", VECTORS, ids=by_name)
def test_real_attestation_verifies_under_its_environments_aaguid_rule(vector: RealAttestation) -> None:
    attested = verify(vector)
    leaf_key = leaf_of(vector).public_key()
    assert attested.public_key_pem == leaf_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    assert attested.counter == 0
    if vector.production:
        # The reference's rule: a non-production server also takes production keys.
        assert verify(vector, production=False) == attested
    else:
        assert reason_of(vector, production=True) == "aaguid_mismatch"


def _assertion_key(vector: RealAttestation, assertion: RealAssertion) -> str:
    return assertion.public_key_pem or verify(vector).public_key_pem


ASSERTIONS = [(vector, assertion) for vector in VECTORS for assertion in vector.assertions]


@pytest.mark.parametrize(("vector", "assertion"), ASSERTIONS, ids=[a.name for _, a in ASSERTIONS])
def test_real_assertion_verifies_with_its_key_and_counter(vector: RealAttestation, assertion: RealAssertion) -> None:
    counter = verify_assertion(
        assertion_object=assertion.assertion_object,
        client_data_hash=assertion.client_data_hash,
        public_key_pem=_assertion_key(vector, assertion),
        app_id=vector.app_id,
        stored_counter=assertion.previous_counter,
    )
    assert counter > assertion.previous_counter
    if assertion.expected_counter is not None:
        assert counter == assertion.expected_counter


def test_assertions_signed_by_the_attested_key_verify_with_the_stored_pem() -> None:
    """The whole flow on real data: the PEM an attestation yields checks later assertions."""
    paired = 0
    for vector, assertion in ASSERTIONS:
        stored = verify(vector)
        if assertion.public_key_pem is not None and _point(assertion.public_key_pem) != _point(stored.public_key_pem):
            continue  # an assertion-only vector, signed by a key given separately
        counter = verify_assertion(
            assertion_object=assertion.assertion_object,
            client_data_hash=assertion.client_data_hash,
            public_key_pem=stored.public_key_pem,
            app_id=vector.app_id,
            stored_counter=stored.counter,
        )
        assert counter >= 1, assertion.name
        paired += 1
    assert paired >= 15


def _point(public_key_pem: str) -> bytes:
    return serialization.load_pem_public_key(public_key_pem.encode()).public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


def test_apples_2026_sample_has_extensions_after_the_key_and_verifies() -> None:
    vector = next(vector for vector in VECTORS if vector.name == "apple-guide-2026")
    auth_data = decoded(vector)["authData"]
    assert auth_data[32] & 0x80 == 0 and len(auth_data) == 226  # ED clear, 62 bytes after the key
    assert verify(vector).counter == 0


# -------------------------------------------------------------- attestation mutations


def _rejections(mutate, **overrides) -> dict[str, str]:
    """Reason per vector for the object `mutate(vector)` returns (None: unchanged)."""
    return {vector.name: reason_of(vector, mutate(vector), **overrides) for vector in VECTORS}


@pytest.mark.parametrize("field", FIELDS)
def test_auth_data_field_byte_changes_break_the_certified_nonce(field: str) -> None:
    start, end = FIELDS[field]
    for offset in sorted({start, end - 1}):
        reasons = _rejections(lambda v: with_part_flipped(v, decoded(v)["authData"], offset))
        assert set(reasons.values()) == {"nonce_mismatch"}, (field, offset, reasons)


def test_credential_id_and_key_byte_changes_break_the_certified_nonce() -> None:
    for vector in VECTORS:
        auth_data = decoded(vector)["authData"]
        credential_end = 55 + int.from_bytes(auth_data[53:55], "big")
        for offset in (55, credential_end - 1, credential_end, len(auth_data) - 1):
            assert reason_of(vector, with_part_flipped(vector, auth_data, offset)) == "nonce_mismatch", (
                vector.name,
                offset,
            )


def test_every_byte_of_apples_2026_auth_data_is_bound_by_the_nonce() -> None:
    vector = next(vector for vector in VECTORS if vector.name == "apple-guide-2026")
    auth_data = decoded(vector)["authData"]
    reasons = {reason_of(vector, with_part_flipped(vector, auth_data, offset)) for offset in range(len(auth_data))}
    assert reasons == {"nonce_mismatch"}


def test_client_data_hash_byte_change_is_a_nonce_mismatch() -> None:
    for vector in VECTORS:
        assert reason_of(vector, client_data_hash=flipped(vector.client_data_hash, 0)) == "nonce_mismatch", vector.name


def test_apples_raw_challenge_is_not_hashed_again() -> None:
    """Apple's samples attest the challenge bytes themselves; hashing them does not match."""
    for name in ("apple-guide-2024", "apple-guide-2026"):
        vector = next(vector for vector in VECTORS if vector.name == name)
        hashed = hashlib.sha256(vector.client_data_hash).digest()
        assert reason_of(vector, client_data_hash=hashed) == "nonce_mismatch"


def test_key_id_byte_change_is_a_key_id_mismatch() -> None:
    reasons = {vector.name: reason_of(vector, key_id=flipped(vector.key_id, 31)) for vector in VECTORS}
    assert set(reasons.values()) == {"key_id_mismatch"}, reasons


def test_other_app_id_is_an_rp_id_mismatch() -> None:
    reasons = {vector.name: reason_of(vector, app_id="A" + vector.app_id[1:]) for vector in VECTORS}
    assert set(reasons.values()) == {"rp_id_mismatch"}, reasons


def test_a_moment_outside_the_leaf_validity_is_certificate_expired() -> None:
    for vector in VECTORS:
        leaf = leaf_of(vector)
        assert reason_of(vector, now=leaf.not_valid_after_utc + timedelta(seconds=1)) == "certificate_expired"
        assert reason_of(vector, now=leaf.not_valid_before_utc - timedelta(seconds=1)) == "certificate_expired"
        assert reason_of(vector, now=leaf.not_valid_after_utc) == "accepted"


def test_leaf_signature_byte_change_is_chain_invalid() -> None:
    def mutate(vector: RealAttestation) -> bytes:
        leaf = decoded(vector)["attStmt"]["x5c"][0]
        return with_part_flipped(vector, leaf, len(leaf) - 1)  # inside the signature's s

    reasons = _rejections(mutate)
    assert set(reasons.values()) == {"chain_invalid"}, reasons


def test_intermediate_signature_byte_change_is_chain_invalid() -> None:
    def mutate(vector: RealAttestation) -> bytes:
        intermediate = decoded(vector)["attStmt"]["x5c"][1]
        return with_part_flipped(vector, intermediate, len(intermediate) - 1)

    reasons = _rejections(mutate)
    assert set(reasons.values()) == {"chain_invalid"}, reasons


def test_certified_nonce_byte_change_is_chain_invalid() -> None:
    """The nonce extension sits inside what Apple signed: changing it breaks the chain."""

    def mutate(vector: RealAttestation) -> bytes:
        leaf = decoded(vector)["attStmt"]["x5c"][0]
        extension_at = leaf.index(bytes.fromhex("3024a1220420"))
        return with_part_flipped(vector, leaf, extension_at + 6 + 31)

    reasons = _rejections(mutate)
    assert set(reasons.values()) == {"chain_invalid"}, reasons


def test_leaf_key_byte_change_is_malformed() -> None:
    """A changed y coordinate is no longer a P-256 point; the certificate does not load."""

    def mutate(vector: RealAttestation) -> bytes:
        leaf = decoded(vector)["attStmt"]["x5c"][0]
        point = leaf_of(vector).public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return with_part_flipped(vector, leaf, leaf.index(point) + len(point) - 1)

    reasons = _rejections(mutate)
    assert set(reasons.values()) == {"malformed"}, reasons


def _reencoded(vector: RealAttestation, **statement_changes) -> bytes:
    document = decoded(vector)
    document["attStmt"] = {**document["attStmt"], **statement_changes}
    return cbor2.dumps(document)


def test_chain_without_intermediate_or_reordered_is_chain_invalid() -> None:
    for vector in VECTORS:
        leaf, intermediate = decoded(vector)["attStmt"]["x5c"]
        assert reason_of(vector, _reencoded(vector, x5c=[leaf])) == "chain_invalid"
        assert reason_of(vector, _reencoded(vector, x5c=[intermediate, leaf])) == "chain_invalid"


def test_another_root_is_chain_invalid() -> None:
    other_root = TestAttestationCA().root
    assert set(_rejections(lambda v: None, root=other_root).values()) == {"chain_invalid"}


def test_format_byte_change_is_format_invalid() -> None:
    reasons = _rejections(lambda v: with_part_flipped(v, b"apple-appattest", 14))
    assert set(reasons.values()) == {"format_invalid"}


def test_truncated_object_is_malformed() -> None:
    assert set(_rejections(lambda v: v.attestation_object[:-1]).values()) == {"malformed"}


def test_receipt_is_not_part_of_the_verdict() -> None:
    """The receipt is for Apple's fraud-metric service; no check reads it."""

    def mutate(vector: RealAttestation) -> bytes:
        receipt = decoded(vector)["attStmt"]["receipt"]
        return with_part_flipped(vector, receipt, len(receipt) // 2)

    assert set(_rejections(mutate).values()) == {"accepted"}


# ------------------------------------------ real authData, re-certified by the test CA
#
# Apple's signature makes every authData change a nonce mismatch first. To show that each
# field's own check reads Apple's real bytes right, the test CA certifies the changed
# authData (for the real leaf's public key), so the checks behind the nonce run.

RECERTIFY_NOW = datetime.now(timezone.utc)
RECERTIFYING_CA = TestAttestationCA(now=RECERTIFY_NOW)


def recertified(vector: RealAttestation, auth_data: bytes) -> bytes:
    nonce = hashlib.sha256(auth_data + vector.client_data_hash).digest()
    leaf = RECERTIFYING_CA.issue_credential_certificate(leaf_of(vector).public_key(), nonce, now=RECERTIFY_NOW)
    x5c = [certificate.public_bytes(serialization.Encoding.DER) for certificate in (leaf, RECERTIFYING_CA.intermediate)]
    return cbor2.dumps({"fmt": "apple-appattest", "attStmt": {"x5c": x5c, "receipt": b""}, "authData": auth_data})


def _y_coordinate_end(auth_data: bytes) -> int:
    credential_end = 55 + int.from_bytes(auth_data[53:55], "big")
    y = cbor2.loads(auth_data[credential_end : credential_end + 77])[-3]
    return auth_data.index(y, credential_end) + len(y)


RECERTIFIED_CHANGES = {
    "rp_id_hash": (lambda auth_data: 0, "rp_id_mismatch"),
    "counter": (lambda auth_data: 36, "counter_not_zero"),
    "aaguid": (lambda auth_data: 37, "aaguid_mismatch"),
    "credential_id_length": (lambda auth_data: 53, "malformed"),
    "credential_id": (lambda auth_data: 55, "key_id_mismatch"),
    "cose_key_y": (lambda auth_data: _y_coordinate_end(auth_data) - 1, "public_key_invalid"),
    # Flags have no check of their own: real devices set AT alone, Apple's 2026 sample
    # has extensions with ED clear. Under Apple's signature the nonce binds them.
    "flags": (lambda auth_data: 32, "accepted"),
}


@pytest.mark.parametrize("field", RECERTIFIED_CHANGES)
def test_each_auth_data_field_check_reads_apples_bytes(field: str) -> None:
    offset_of, expected = RECERTIFIED_CHANGES[field]
    reasons = {}
    for vector in VECTORS:
        auth_data = decoded(vector)["authData"]
        assert reason_of(vector, recertified(vector, auth_data), root=RECERTIFYING_CA.root, now=RECERTIFY_NOW) == "accepted"
        changed = flipped(auth_data, offset_of(auth_data))
        reasons[vector.name] = reason_of(vector, recertified(vector, changed), root=RECERTIFYING_CA.root, now=RECERTIFY_NOW)
    assert set(reasons.values()) == {expected}, reasons


def test_apples_2026_extension_bytes_are_not_read() -> None:
    vector = next(vector for vector in VECTORS if vector.name == "apple-guide-2026")
    auth_data = decoded(vector)["authData"]
    for offset in (164, 200, 225):  # inside the 62 bytes after the COSE key
        changed = flipped(auth_data, offset)
        assert reason_of(vector, recertified(vector, changed), root=RECERTIFYING_CA.root, now=RECERTIFY_NOW) == "accepted"


# ---------------------------------------------------------------- assertion mutations


def assertion_reason(vector: RealAttestation, assertion: RealAssertion, assertion_object: bytes, **overrides) -> str:
    arguments = {
        "assertion_object": assertion_object,
        "client_data_hash": assertion.client_data_hash,
        "public_key_pem": _assertion_key(vector, assertion),
        "app_id": vector.app_id,
        "stored_counter": assertion.previous_counter,
    }
    try:
        verify_assertion(**{**arguments, **overrides})
    except AssertionInvalid as rejected:
        return rejected.reason
    return "accepted"


def test_every_byte_of_authenticator_data_and_signature_is_signed() -> None:
    for vector, assertion in ASSERTIONS:
        raw = assertion.assertion_object
        document = cbor2.loads(raw)
        for part in ("authenticatorData", "signature"):
            start = raw.index(document[part])
            reasons = {
                assertion_reason(vector, assertion, flipped(raw, start + offset))
                for offset in range(len(document[part]))
            }
            assert reasons == {"signature_invalid"}, (assertion.name, part, reasons)


def test_assertion_semantic_checks_on_real_assertions() -> None:
    keys = [_assertion_key(vector, assertion) for vector, assertion in ASSERTIONS]
    for index, (vector, assertion) in enumerate(ASSERTIONS):
        raw = assertion.assertion_object
        counter = int.from_bytes(cbor2.loads(raw)["authenticatorData"][33:37], "big")
        other_key = next(key for key in keys[index + 1 :] + keys[:index] if key != keys[index])
        cases = {
            "client_data_hash": (dict(client_data_hash=flipped(assertion.client_data_hash, 0)), "signature_invalid"),
            "other_key": (dict(public_key_pem=other_key), "signature_invalid"),
            "app_id": (dict(app_id="A" + vector.app_id[1:]), "rp_id_mismatch"),
            "replayed_counter": (dict(stored_counter=counter), "counter_not_increasing"),
            "lower_counter": (dict(stored_counter=counter + 1), "counter_not_increasing"),
        }
        for case, (overrides, expected) in cases.items():
            assert assertion_reason(vector, assertion, raw, **overrides) == expected, (assertion.name, case)
        assert assertion_reason(vector, assertion, raw, stored_counter=counter - 1) == "accepted"
        assert assertion_reason(vector, assertion, raw[:-1]) == "malformed"
