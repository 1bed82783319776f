"""App Attest: attestation and assertion verification, the JWT envelope, base64 handling."""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime, timedelta, timezone

import cbor2
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mlpa_aiohttp.auth.app_attest_crypto import (
    AAGUID_DEVELOPMENT,
    AAGUID_PRODUCTION,
    AssertionInvalid,
    AttestationInvalid,
    StoredKeyInvalid,
    load_root,
    production_root,
    verify_assertion,
    verify_attestation,
)
from mlpa_aiohttp.auth.envelope import (
    ASSERTION_CLAIMS,
    ATTESTATION_CLAIMS,
    Base64Invalid,
    EnvelopeInvalid,
    decode_base64,
    decode_envelope,
    is_plausible_key_id,
)
from tests.support.app_attest_device import (
    APPLE_2026_EXTENSIONS,
    TestAttestationCA,
    TestDevice,
    encode_nonce_extension,
)

TEAM_ID = "TEAM123456"
BUNDLE_ID = "org.mozilla.ios.Firefox"
CHALLENGE = b"9f2c" * 16
NOW = datetime.now(timezone.utc)


@pytest.fixture(scope="module")
def ca() -> TestAttestationCA:
    return TestAttestationCA()


@pytest.fixture
def device(ca: TestAttestationCA) -> TestDevice:
    return TestDevice(ca, TEAM_ID, BUNDLE_ID)


@pytest.fixture
def production_device(ca: TestAttestationCA) -> TestDevice:
    return TestDevice(ca, TEAM_ID, BUNDLE_ID, production=True)


def attest(
    device: TestDevice,
    attestation_object: bytes,
    *,
    production: bool = False,
    key_id: bytes | None = None,
    challenge: bytes = CHALLENGE,
    now: datetime = NOW,
    app_id: str | None = None,
):
    return verify_attestation(
        attestation_object=attestation_object,
        client_data_hash=hashlib.sha256(challenge).digest(),
        key_id=device.key_id if key_id is None else key_id,
        app_id=app_id or device.app_id,
        production=production,
        root=device.ca.root,
        now=now,
    )


# ------------------------------------------------------------------------ attestation


def test_valid_development_attestation_yields_device_key_and_zero_counter(device: TestDevice) -> None:
    attested = attest(device, device.attest(CHALLENGE))
    assert attested.counter == 0
    assert attested.public_key_pem == device.public_key_pem


def test_valid_production_attestation_passes_in_production(production_device: TestDevice) -> None:
    attested = attest(production_device, production_device.attest(CHALLENGE), production=True)
    assert attested.public_key_pem == production_device.public_key_pem


def test_production_aaguid_is_accepted_in_development(device: TestDevice) -> None:
    assert attest(device, device.attest(CHALLENGE, aaguid=AAGUID_PRODUCTION)).counter == 0


def test_development_aaguid_rejected_in_production(device: TestDevice) -> None:
    attestation = device.attest(CHALLENGE, aaguid=AAGUID_DEVELOPMENT)
    attest(device, attestation, production=False)  # the same object passes in development
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, attestation, production=True)
    assert caught.value.reason == "aaguid_mismatch"


def test_unknown_aaguid_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, aaguid=b"x" * 16))
    assert caught.value.reason == "aaguid_mismatch"


def test_wrong_nonce_in_certificate_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, wrong_nonce=True))
    assert caught.value.reason == "nonce_mismatch"


def test_other_challenge_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE), challenge=b"another challenge")
    assert caught.value.reason == "nonce_mismatch"


def test_chain_from_foreign_ca_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, foreign_ca=True))
    assert caught.value.reason == "chain_invalid"


def test_test_ca_attestation_rejected_under_apple_root(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        verify_attestation(
            attestation_object=device.attest(CHALLENGE),
            client_data_hash=hashlib.sha256(CHALLENGE).digest(),
            key_id=device.key_id,
            app_id=device.app_id,
            production=False,
            root=production_root(),
            now=NOW,
        )
    assert caught.value.reason == "chain_invalid"


def test_expired_credential_certificate_rejected(device: TestDevice) -> None:
    attestation = device.attest(CHALLENGE)
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, attestation, now=NOW + timedelta(days=30))
    assert caught.value.reason == "certificate_expired"


def test_wrong_rp_id_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, wrong_rp_id=True))
    assert caught.value.reason == "rp_id_mismatch"


def test_attestation_for_other_bundle_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE), app_id=f"{TEAM_ID}.org.example.other")
    assert caught.value.reason == "rp_id_mismatch"


def test_non_zero_counter_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, counter=1))
    assert caught.value.reason == "counter_not_zero"


def test_key_id_not_matching_certified_key_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE), key_id=hashlib.sha256(b"someone else").digest())
    assert caught.value.reason == "key_id_mismatch"


def test_credential_id_not_matching_key_id_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, wrong_key_id=True))
    assert caught.value.reason == "key_id_mismatch"


def test_certificate_for_other_key_rejected(device: TestDevice) -> None:
    other_key = ec.generate_private_key(ec.SECP256R1()).public_key()
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, certified_public_key=other_key))
    assert caught.value.reason == "key_id_mismatch"


def test_certificate_with_non_p256_key_rejected(device: TestDevice) -> None:
    p384_key = ec.generate_private_key(ec.SECP384R1()).public_key()
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, certified_public_key=p384_key))
    assert caught.value.reason == "public_key_invalid"


def test_cose_key_differing_from_certified_key_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, other_cose_key=True))
    assert caught.value.reason == "public_key_mismatch"


def test_intermediate_without_ca_flag_rejected() -> None:
    device = TestDevice(TestAttestationCA(intermediate_is_ca=False), TEAM_ID, BUNDLE_ID)
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE))
    assert caught.value.reason == "chain_invalid"


def test_leaf_without_digital_signature_usage_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, leaf_digital_signature=False))
    assert caught.value.reason == "chain_invalid"


def test_intermediate_without_certificate_signing_usage_rejected() -> None:
    device = TestDevice(TestAttestationCA(intermediate_signs_certificates=False), TEAM_ID, BUNDLE_ID)
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE))
    assert caught.value.reason == "chain_invalid"


_PRIVATE_EXTENSION = x509.ObjectIdentifier("1.3.6.1.4.1.55555.1")


@pytest.mark.parametrize(("critical", "reason"), [(False, "accepted"), (True, "chain_invalid")])
def test_unknown_leaf_extension_is_refused_only_when_critical(device: TestDevice, critical: bool, reason: str) -> None:
    """RFC 5280 §4.2: a critical extension the verifier does not act on voids the chain."""
    decoded = cbor2.loads(device.attest(CHALLENGE))
    nonce = hashlib.sha256(decoded["authData"] + hashlib.sha256(CHALLENGE).digest()).digest()
    extension = x509.UnrecognizedExtension(_PRIVATE_EXTENSION, b"\x05\x00")
    leaf = device.ca.issue_credential_certificate(
        device._private_key.public_key(), nonce, extra_extensions=((extension, critical),)
    )
    decoded["attStmt"]["x5c"][0] = leaf.public_bytes(serialization.Encoding.DER)
    try:
        verdict = attest(device, cbor2.dumps(decoded)).counter == 0 and "accepted"
    except AttestationInvalid as rejected:
        verdict = rejected.reason
    assert verdict == reason


def _sub_ca_chain(device: TestDevice, nonce: bytes) -> list[bytes]:
    """[leaf, sub-CA, intermediate]: one CA more than the intermediate's path length 0 allows."""
    sub_key = ec.generate_private_key(ec.SECP256R1())
    sub_name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "Sub CA")])
    valid_from, valid_to = NOW - timedelta(days=1), NOW + timedelta(days=1)
    sub = (
        x509.CertificateBuilder()
        .subject_name(sub_name)
        .issuer_name(device.ca.intermediate.subject)
        .public_key(sub_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(device.ca._intermediate_key, hashes.SHA256())
    )
    leaf_template = device.ca.issue_credential_certificate(device._private_key.public_key(), nonce, now=NOW)
    builder = (
        x509.CertificateBuilder()
        .subject_name(leaf_template.subject)
        .issuer_name(sub_name)
        .public_key(device._private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_to)
    )
    for extension in leaf_template.extensions:
        builder = builder.add_extension(extension.value, critical=extension.critical)
    leaf = builder.sign(sub_key, hashes.SHA256())
    return [c.public_bytes(serialization.Encoding.DER) for c in (leaf, sub, device.ca.intermediate)]


def test_chain_longer_than_the_intermediates_path_length_rejected(device: TestDevice) -> None:
    decoded = cbor2.loads(device.attest(CHALLENGE))
    nonce = hashlib.sha256(decoded["authData"] + hashlib.sha256(CHALLENGE).digest()).digest()
    assert device.ca.intermediate.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    decoded["attStmt"]["x5c"] = _sub_ca_chain(device, nonce)
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, cbor2.dumps(decoded))
    assert caught.value.reason == "chain_invalid"


def _auth_data_prefix(device: TestDevice) -> bytes:
    return hashlib.sha256(device.app_id.encode()).digest() + b"\x41" + b"\x00" * 4 + AAGUID_DEVELOPMENT


@pytest.mark.parametrize(
    "auth_data_tail",
    [b"", b"\x00", b"\x00\x20" + b"k" * 31, b"\x00\x20KEYID"],
    ids=["no-credential", "half-length", "short-credential-id", "no-cose-key"],
)
def test_truncated_auth_data_with_matching_nonce_rejected(device: TestDevice, auth_data_tail: bytes) -> None:
    auth_data = _auth_data_prefix(device) + auth_data_tail.replace(b"KEYID", device.key_id)
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, auth_data=auth_data))
    assert caught.value.reason == "malformed"


@pytest.mark.parametrize(
    "cose_key",
    [
        cbor2.dumps([1, 2]),
        cbor2.dumps({1: 2, 3: -7, -1: 2, -2: b"x" * 32, -3: b"y" * 32}),
        cbor2.dumps({1: 2, 3: -35, -1: 1, -2: b"x" * 32, -3: b"y" * 32}),
        cbor2.dumps({1: 2, 3: -7, -1: 1, -2: b"x" * 32, -3: b"y" * 32}),
    ],
    ids=["not-a-map", "curve-p384", "alg-es384", "point-not-on-curve"],
)
def test_bad_cose_key_rejected(device: TestDevice, cose_key: bytes) -> None:
    auth_data = _auth_data_prefix(device) + b"\x00\x20" + device.key_id + cose_key
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, auth_data=auth_data))
    assert caught.value.reason == "public_key_invalid"


def _nonce_for(device: TestDevice, attestation_object: bytes) -> bytes:
    auth_data = cbor2.loads(attestation_object)["authData"]
    return hashlib.sha256(auth_data + hashlib.sha256(CHALLENGE).digest()).digest()


@pytest.mark.parametrize(
    "make_extension",
    [
        lambda n: b"\x31\x24\xa1\x22\x04\x20" + n,  # SET instead of SEQUENCE
        lambda n: b"\x30\x24\xa1\x22\x04\x20" + n + b"\x00",  # trailing byte after SEQUENCE
        lambda n: b"\x30\x24\xa1\x22\x03\x20" + n,  # BIT STRING instead of OCTET STRING
        lambda n: b"\x30\x26\xa1\x24\x04\x20" + n + b"\x05\x00",  # [1] holds two elements
        lambda n: b"\x30\x24\xa2\x22\x04\x20" + n,  # [2] instead of [1]
        lambda n: b"\x30\x24\xa1\x22\x04\x20" + n[:-1],  # truncated
        lambda n: b"\x30",  # shorter than a TLV header
        lambda n: b"\x1f\x81\x00",  # multi-byte tag
        lambda n: b"\x30\x80" + n,  # indefinite length
        lambda n: b"\x30\x85\x00\x00\x00\x00\x24",  # five length octets
        # Not DER (a BER long form where the short form fits): certificates carry DER only.
        lambda n: b"\x30\x81\x25" + b"\xa1\x81\x22" + b"\x04\x20" + n,
        # Apple's sequence holds the one [1] element; anything else is not Apple's format.
        lambda n: b"\x30\x29" + b"\xa0\x03\x02\x01\x01" + b"\xa1\x22\x04\x20" + n,
        lambda n: b"\x30\x24\xa1\x22\x04\x20" + n[::-1],  # well formed, another nonce
    ],
    ids=[
        "set", "trailing", "bit-string", "two-in-tag", "tag-2", "truncated", "short", "high-tag", "indefinite",
        "long-length", "ber-long-form", "extra-element", "other-nonce",
    ],
)
def test_malformed_nonce_extension_rejected(device: TestDevice, make_extension) -> None:
    nonce = _nonce_for(device, device.attest(CHALLENGE))
    # authData is deterministic for a device, so the nonce computed above still applies.
    assert attest(device, device.attest(CHALLENGE, nonce_extension_der=encode_nonce_extension(nonce))).counter == 0
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, nonce_extension_der=make_extension(nonce)))
    assert caught.value.reason == "nonce_mismatch"


def test_missing_nonce_extension_rejected(device: TestDevice) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE, omit_nonce_extension=True))
    assert caught.value.reason == "nonce_mismatch"


@pytest.mark.parametrize(
    "attestation_object",
    [
        b"",
        b"\xff\x00garbage",
        cbor2.dumps([1, 2, 3]),
        cbor2.dumps({"fmt": "apple-appattest", "attStmt": {}, "authData": b"x"}),
        cbor2.dumps({"fmt": "apple-appattest", "attStmt": {"x5c": [b"not a certificate"]}, "authData": b"x"}),
        cbor2.dumps({"fmt": "apple-appattest", "attStmt": [b"x"], "authData": b"x"}),
        cbor2.dumps({"fmt": "apple-appattest", "attStmt": {"x5c": [b"x"]}, "authData": "text"}),
    ],
    ids=["empty", "not-cbor", "not-a-map", "no-x5c", "bad-certificate", "statement-not-map", "auth-data-not-bytes"],
)
def test_malformed_attestation_rejected(device: TestDevice, attestation_object: bytes) -> None:
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, attestation_object)
    assert caught.value.reason == "malformed"


@pytest.mark.parametrize(
    ("original", "replacement"),
    [
        (bytes.fromhex("a003020102"), bytes.fromhex("a003020109")),  # X.509 version 10
        (bytes.fromhex("06082a8648ce3d030107"), bytes.fromhex("06082a8648ce3d030199")),  # unknown curve
    ],
    ids=["bad-version", "unknown-curve"],
)
def test_certificate_defects_found_by_lazy_parsing_are_malformed(
    device: TestDevice, original: bytes, replacement: bytes
) -> None:
    decoded = cbor2.loads(device.attest(CHALLENGE))
    leaf = decoded["attStmt"]["x5c"][0]
    assert original in leaf
    decoded["attStmt"]["x5c"][0] = leaf.replace(original, replacement, 1)
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, cbor2.dumps(decoded))
    assert caught.value.reason == "malformed"


def test_other_attestation_format_rejected(device: TestDevice) -> None:
    decoded = cbor2.loads(device.attest(CHALLENGE))
    decoded["fmt"] = "packed"
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, cbor2.dumps(decoded))
    assert caught.value.reason == "format_invalid"


def test_truncated_auth_data_rejected(device: TestDevice) -> None:
    decoded = cbor2.loads(device.attest(CHALLENGE))
    decoded["authData"] = decoded["authData"][:60]
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, cbor2.dumps(decoded))
    # The nonce no longer matches the shortened authData, which is checked first.
    assert caught.value.reason == "nonce_mismatch"


def test_nonce_extension_encoding_matches_apples_layout() -> None:
    nonce = bytes(range(32))
    assert encode_nonce_extension(nonce) == bytes.fromhex("3024a1220420") + nonce


def test_packaged_apple_root_loads() -> None:
    root = production_root()
    assert "Apple App Attestation Root CA" in root.subject.rfc4514_string()
    assert load_root(root.public_bytes(serialization.Encoding.PEM)) == root


# -------------------------------------------------------------------------- assertion

BODY = b'{"model":"x","messages":[{"role":"user","content":"h\xc3\xa9"}]}'


def assert_body(
    device: TestDevice, assertion_object: bytes, *, stored_counter: int = 0, body: bytes = BODY, app_id: str | None = None
) -> int:
    return verify_assertion(
        assertion_object=assertion_object,
        client_data_hash=hashlib.sha256(body).digest(),
        public_key_pem=device.public_key_pem,
        app_id=app_id or device.app_id,
        stored_counter=stored_counter,
    )


def test_valid_assertion_returns_new_counter(device: TestDevice) -> None:
    assert assert_body(device, device.assertion(BODY, 5), stored_counter=4) == 5


def test_assertion_with_attested_key_pem(device: TestDevice) -> None:
    stored = attest(device, device.attest(CHALLENGE))
    new_counter = verify_assertion(
        assertion_object=device.assertion(BODY, 1),
        client_data_hash=hashlib.sha256(BODY).digest(),
        public_key_pem=stored.public_key_pem,
        app_id=device.app_id,
        stored_counter=stored.counter,
    )
    assert new_counter == 1


@pytest.mark.parametrize("stored_counter", [5, 6], ids=["equal", "lower"])
def test_replayed_or_lower_counter_rejected(device: TestDevice, stored_counter: int) -> None:
    with pytest.raises(AssertionInvalid) as caught:
        assert_body(device, device.assertion(BODY, 5), stored_counter=stored_counter)
    assert caught.value.reason == "counter_not_increasing"


def test_assertion_signed_by_other_key_rejected(device: TestDevice) -> None:
    with pytest.raises(AssertionInvalid) as caught:
        assert_body(device, device.assertion(BODY, 1, wrong_key=True))
    assert caught.value.reason == "signature_invalid"


def test_tampered_body_rejected(device: TestDevice) -> None:
    with pytest.raises(AssertionInvalid) as caught:
        assert_body(device, device.assertion(BODY, 1), body=BODY + b" ")
    assert caught.value.reason == "signature_invalid"


def test_assertion_for_other_app_id_rejected(device: TestDevice) -> None:
    with pytest.raises(AssertionInvalid) as caught:
        assert_body(device, device.assertion(BODY, 1, rp_id=f"{TEAM_ID}.org.example.other"))
    assert caught.value.reason == "rp_id_mismatch"


def test_single_hash_signature_is_not_what_we_accept(device: TestDevice) -> None:
    """Pins the double hash: a signature whose digest is the nonce itself is refused."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import utils

    valid = cbor2.loads(device.assertion(BODY, 1))
    nonce = hashlib.sha256(valid["authenticatorData"] + hashlib.sha256(BODY).digest()).digest()
    private_key = device._private_key  # the device's own key, signing the wrong digest
    single_hash_signature = private_key.sign(nonce, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
    forged = cbor2.dumps({"authenticatorData": valid["authenticatorData"], "signature": single_hash_signature})
    with pytest.raises(AssertionInvalid):
        assert_body(device, forged)
    assert assert_body(device, device.assertion(BODY, 1)) == 1


@pytest.mark.parametrize(
    "assertion_object",
    [
        b"\xff",
        cbor2.dumps("text"),
        cbor2.dumps({"authenticatorData": b"short", "signature": b"sig"}),
        cbor2.dumps({"authenticatorData": b"a" * 37}),
    ],
    ids=["not-cbor", "not-a-map", "short-auth-data", "no-signature"],
)
def test_malformed_assertion_rejected(device: TestDevice, assertion_object: bytes) -> None:
    with pytest.raises(AssertionInvalid) as caught:
        assert_body(device, assertion_object)
    assert caught.value.reason == "malformed"


@pytest.mark.parametrize(
    "public_key_pem",
    [
        "not a pem",
        ec.generate_private_key(ec.SECP384R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    ],
    ids=["garbage", "p384"],
)
def test_unloadable_stored_key_is_a_server_fault(device: TestDevice, public_key_pem: str) -> None:
    with pytest.raises(StoredKeyInvalid):
        verify_assertion(
            assertion_object=device.assertion(BODY, 1),
            client_data_hash=hashlib.sha256(BODY).digest(),
            public_key_pem=public_key_pem,
            app_id=device.app_id,
            stored_counter=0,
        )


# --------------------------------------------------------------------------- envelope


def test_attestation_envelope_round_trip(device: TestDevice) -> None:
    token = device.attestation_jwt(CHALLENGE.decode())
    claims = decode_envelope(f"Bearer {token}", ATTESTATION_CLAIMS)
    assert claims["key_id_b64"] == device.key_id_b64
    assert decode_base64(claims["challenge_b64"]) == CHALLENGE
    assert claims["bundle_id"] == BUNDLE_ID
    attested = attest(device, decode_base64(claims["attestation_obj_b64"]), key_id=decode_base64(claims["key_id_b64"]))
    assert attested.public_key_pem == device.public_key_pem


def test_assertion_envelope_without_bearer_prefix(device: TestDevice) -> None:
    token = device.assertion_jwt(CHALLENGE.decode(), BODY, 3)
    claims = decode_envelope(token, ASSERTION_CLAIMS)
    assert assert_body(device, decode_base64(claims["assertion_obj_b64"])) == 3


def test_envelope_ignores_signature_and_expiry() -> None:
    claims = {name: "v" for name in ATTESTATION_CLAIMS}
    token = jwt.encode({**claims, "exp": 1, "nbf": 4102444800, "aud": "x", "iss": "y"}, "some-key-of-32-bytes-or-more!!!!", algorithm="HS256")
    assert decode_envelope(token, ATTESTATION_CLAIMS) == claims


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer ", "Bearer not.a.jwt", "abc", "Bearer a.b"],
)
def test_unparseable_envelope_rejected(authorization: str) -> None:
    with pytest.raises(EnvelopeInvalid):
        decode_envelope(authorization, ATTESTATION_CLAIMS)


def test_envelope_with_unknown_alg_rejected() -> None:
    header = base64.urlsafe_b64encode(b'{"alg":"XX999","typ":"JWT"}').rstrip(b"=").decode()
    payload = base64.urlsafe_b64encode(b'{"key_id_b64":"a"}').rstrip(b"=").decode()
    with pytest.raises(EnvelopeInvalid):
        decode_envelope(f"{header}.{payload}.c2ln", ["key_id_b64"])
    valid_header = base64.urlsafe_b64encode(b'{"alg":"ES256","typ":"JWT"}').rstrip(b"=").decode()
    assert decode_envelope(f"{valid_header}.{payload}.c2ln", ["key_id_b64"]) == {"key_id_b64": "a"}


def test_envelope_missing_claim_rejected() -> None:
    claims = {name: "v" for name in ATTESTATION_CLAIMS if name != "bundle_id"}
    with pytest.raises(EnvelopeInvalid):
        decode_envelope(jwt.encode(claims, "k" * 32, algorithm="HS256"), ATTESTATION_CLAIMS)


def test_envelope_non_string_claim_rejected() -> None:
    claims: dict[str, object] = {name: "v" for name in ASSERTION_CLAIMS}
    claims["key_id_b64"] = 12345
    with pytest.raises(EnvelopeInvalid):
        decode_envelope(jwt.encode(claims, "k" * 32, algorithm="HS256"), ASSERTION_CLAIMS)


@pytest.mark.parametrize(
    ("key_id", "plausible"),
    [
        ("dGVzdC1rZXktaWQ=", True),
        ("ab+/09==", True),
        ("", False),
        ("a" * 128, True),
        ("a" * 129, False),
        ("abc-def", False),
        ("abc_def", False),
        ("'; DROP TABLE public_keys; --", False),
        ("abc def", False),
    ],
)
def test_key_id_plausibility(key_id: str, plausible: bool) -> None:
    assert is_plausible_key_id(key_id) is plausible


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aGk=", b"hi"),
        ("aGk", b"hi"),
        ("-_8=", b"\xfb\xff"),
        ("+/8=", b"\xfb\xff"),
        ("+/8", b"\xfb\xff"),
        ("", b""),
    ],
)
def test_base64_accepts_both_alphabets_and_missing_padding(text: str, expected: bytes) -> None:
    assert decode_base64(text) == expected


@pytest.mark.parametrize("text", ["a", "aGk==", "aG=k", "aGk*", "aG k", "aGk=\n", "aGk==="])
def test_base64_rejects_garbage_and_wrong_padding(text: str) -> None:
    with pytest.raises(Base64Invalid):
        decode_base64(text)


# ------------------------------------------------- Apple's formulation (client_data_hash)


def test_apples_formulation_raw_challenge_as_client_data_hash(device: TestDevice) -> None:
    """Apple's samples hand the challenge bytes themselves to the device as clientDataHash."""
    attestation = device.attest(CHALLENGE, raw_client_data_hash=True)
    attested = verify_attestation(
        attestation_object=attestation,
        client_data_hash=CHALLENGE,
        key_id=device.key_id,
        app_id=device.app_id,
        production=False,
        root=device.ca.root,
        now=NOW,
    )
    assert attested.public_key_pem == device.public_key_pem
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, attestation)  # the request path's SHA-256(challenge) is another hash
    assert caught.value.reason == "nonce_mismatch"


@pytest.mark.parametrize("flags", [0x40, 0xC0, 0x41, 0x45], ids=["at", "at-ed", "at-up", "at-up-uv"])
def test_extension_bytes_after_the_key_are_accepted_whatever_the_flags(device: TestDevice, flags: int) -> None:
    """Apple's 2026 sample: CBOR extensions after the COSE key, ED flag clear."""
    plain = cbor2.loads(device.attest(CHALLENGE))["authData"]
    auth_data = plain[:32] + bytes([flags]) + plain[33:] + APPLE_2026_EXTENSIONS
    attested = attest(device, device.attest(CHALLENGE, auth_data=auth_data))
    assert attested.public_key_pem == device.public_key_pem
    assert attest(device, device.attest(CHALLENGE, extensions=APPLE_2026_EXTENSIONS)).counter == 0


def test_app_id_with_a_lone_surrogate_matches_nothing(device: TestDevice) -> None:
    """A JSON `bundle_id` may carry "\\ud800"; it cannot be UTF-8, so it names no app."""
    with pytest.raises(AttestationInvalid) as caught:
        attest(device, device.attest(CHALLENGE), app_id=device.app_id + "\ud800")
    assert caught.value.reason == "rp_id_mismatch"
    with pytest.raises(AssertionInvalid) as caught_assertion:
        assert_body(device, device.assertion(BODY, 1), app_id=device.app_id + "\ud800")
    assert caught_assertion.value.reason == "rp_id_mismatch"
