"""Property tests: whatever bytes arrive, the App Attest verifier answers with its own typed
rejection (`AttestationInvalid` / `AssertionInvalid`, a reason from a fixed set) or a
verdict, never another exception (which the route would turn into a 500).

Inputs: arbitrary bytes, arbitrary CBOR documents, documents shaped like Apple's with
hostile parts, mutations of genuine objects, and, signed by the test CA so that the
checks behind the signatures run too, hostile authData and nonce-extension bytes.

`MLPA_FUZZ_EXAMPLES` scales every test's example budget (default: a few seconds in all), on
top of the run's depth (tests/support/depth.py).
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime, timedelta, timezone
from typing import Annotated

import cbor2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mlpa_aiohttp.auth.app_attest_crypto import (
    AAGUID_DEVELOPMENT,
    ATTESTATION_FORMAT,
    AssertionInvalid,
    AttestationInvalid,
    verify_assertion,
    verify_attestation,
)
from tests.support.app_attest_device import TestAttestationCA, TestDevice, encode_nonce_extension
from tests.support.depth import examples as at_this_depth

from .app_attest_vectors import load_vectors, vectors_dir

SCALE = float(os.environ.get("MLPA_FUZZ_EXAMPLES", "1"))
ATTESTATION_REASONS = {
    "malformed", "format_invalid", "chain_invalid", "certificate_expired", "nonce_mismatch",
    "key_id_mismatch", "rp_id_mismatch", "counter_not_zero", "aaguid_mismatch",
    "public_key_invalid", "public_key_mismatch",
}  # fmt: skip
ASSERTION_REASONS = {"malformed", "signature_invalid", "rp_id_mismatch", "counter_not_increasing"}

TEAM_ID, BUNDLE_ID = "TEAM123456", "org.mozilla.ios.Firefox"
CHALLENGE = b"c0ffee" * 8
NOW = datetime.now(timezone.utc)
CA = TestAttestationCA(now=NOW)
DEVICE = TestDevice(CA, TEAM_ID, BUNDLE_ID)
GENUINE_ATTESTATION = DEVICE.attest(CHALLENGE)
GENUINE_ASSERTION = DEVICE.assertion(b"{}", 1)
NONCE = hashlib.sha256(cbor2.loads(GENUINE_ATTESTATION)["authData"] + hashlib.sha256(CHALLENGE).digest()).digest()
GENUINE_EXTENSION = encode_nonce_extension(NONCE)
_FOLDER = vectors_dir()
REAL = load_vectors(_FOLDER) if _FOLDER else []
SEED_ATTESTATIONS = [GENUINE_ATTESTATION] + [vector.attestation_object for vector in REAL]
SEED_ASSERTIONS = [GENUINE_ASSERTION] + [a.assertion_object for vector in REAL for a in vector.assertions]


def budget(examples: int) -> settings:
    return settings(
        max_examples=max(1, int(at_this_depth(examples) * SCALE)),
        deadline=None,  # a shared 2-core machine; speed is not the property
        database=None,  # no .hypothesis folder in the worktree
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------- strategies

texts = st.one_of(st.text(max_size=20), st.text(max_size=5).map(lambda text: text + "\ud800"))
cbor_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    texts,
    st.binary(max_size=80),
)


def _tagged(children: st.SearchStrategy) -> st.SearchStrategy:
    # Semantic tags the decoder interprets (dates, bignums, decimals, rationals, regexes,
    # sets, shared references, ...) with values of any shape.
    tag_numbers = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 5, 24, 25, 28, 29, 30, 35, 36, 37, 258, 260, 261, 55799]),
                            st.integers(min_value=0, max_value=2**64 - 1))  # fmt: skip
    return st.builds(cbor2.CBORTag, tag_numbers, children)


cbor_values = st.recursive(
    cbor_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=12), st.integers(-4, 4)), children, max_size=5),
        _tagged(children),
    ),
    max_leaves=25,
)


def _encoded(value: object) -> bytes:
    try:
        return cbor2.dumps(value)
    except (cbor2.CBOREncodeError, ValueError, TypeError, OverflowError):
        return b"\xa0"


cbor_documents = cbor_values.map(_encoded)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed with a few flips, truncations, insertions, deletions or splices."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "duplicate"]))
        position = draw(st.integers(0, max(0, len(data) - 1)))
        if operation == "flip" and data:
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif operation == "set" and data:
            data[position] = draw(st.integers(0, 255))
        elif operation == "truncate":
            del data[position:]
        elif operation == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=16))
        elif operation == "delete":
            del data[position : position + draw(st.integers(1, 64))]
        else:
            data[position:position] = data[position : position + draw(st.integers(1, 64))]
    return bytes(data)


def _genuine_parts() -> dict:
    return cbor2.loads(GENUINE_ATTESTATION)


@st.composite
def apple_shaped_attestations(draw: st.DrawFn) -> bytes:
    """Apple's outer shape, each part genuine, mutated, or of the wrong type."""
    genuine = _genuine_parts()
    leaf, intermediate = genuine["attStmt"]["x5c"]
    certificate = st.one_of(st.just(leaf), st.just(intermediate), mutated([leaf, intermediate]), st.binary(max_size=64))
    x5c = st.one_of(st.lists(certificate, min_size=0, max_size=5), cbor_values)
    statement = st.one_of(
        st.fixed_dictionaries({"x5c": x5c}, optional={"receipt": st.binary(max_size=16), "alg": cbor_values}),
        cbor_values,
    )
    document = draw(
        st.fixed_dictionaries(
            {
                "fmt": st.one_of(st.just(ATTESTATION_FORMAT), cbor_values),
                "attStmt": statement,
                "authData": st.one_of(st.just(genuine["authData"]), mutated([genuine["authData"]]), cbor_values),
            }
        )
    )
    return _encoded(document)


attestation_inputs = st.one_of(
    st.binary(max_size=400),
    cbor_documents,
    apple_shaped_attestations(),
    mutated(SEED_ATTESTATIONS),
)
assertion_inputs = st.one_of(
    st.binary(max_size=200),
    cbor_documents,
    st.fixed_dictionaries(
        {"authenticatorData": st.one_of(st.binary(max_size=60), cbor_values), "signature": st.one_of(st.binary(max_size=80), cbor_values)}
    ).map(_encoded),
    st.just(GENUINE_ASSERTION),
    mutated(SEED_ASSERTIONS),
)


# ----------------------------------------------------------------------------- properties


def attestation_verdict(attestation_object: bytes, **overrides) -> str:
    arguments = {
        "attestation_object": attestation_object,
        "client_data_hash": hashlib.sha256(CHALLENGE).digest(),
        "key_id": DEVICE.key_id,
        "app_id": DEVICE.app_id,
        "production": False,
        "root": CA.root,
        "now": NOW,
    }
    try:
        verify_attestation(**{**arguments, **overrides})
    except AttestationInvalid as rejected:
        assert rejected.reason in ATTESTATION_REASONS
        return rejected.reason
    return "accepted"


@budget(200)
@given(attestation_object=attestation_inputs)
def test_any_attestation_object_gets_a_typed_verdict(attestation_object: bytes) -> None:
    verdict = attestation_verdict(attestation_object)
    if verdict == "accepted":
        # Only the genuine object, or one whose change Apple's checks do not cover (the
        # receipt, the outer CBOR's encoding), may pass.
        assert cbor2.loads(attestation_object)["authData"] == _genuine_parts()["authData"]


@budget(150)
@given(
    client_data_hash=st.one_of(st.just(hashlib.sha256(CHALLENGE).digest()), st.binary(max_size=64)),
    key_id=st.one_of(st.just(DEVICE.key_id), st.binary(max_size=64)),
    app_id=st.one_of(st.just(DEVICE.app_id), texts),
    production=st.booleans(),
)
def test_any_request_values_get_a_typed_verdict(client_data_hash: bytes, key_id: bytes, app_id: str, production: bool) -> None:
    verdict = attestation_verdict(
        GENUINE_ATTESTATION, client_data_hash=client_data_hash, key_id=key_id, app_id=app_id, production=production
    )
    assert verdict in ATTESTATION_REASONS | {"accepted"}


def _auth_data_prefix() -> bytes:
    return hashlib.sha256(DEVICE.app_id.encode()).digest() + b"\x40" + bytes(4) + AAGUID_DEVELOPMENT


@st.composite
def hostile_auth_data(draw: st.DrawFn) -> bytes:
    """authData that the test CA will certify: the checks behind the nonce see it."""
    genuine = _genuine_parts()["authData"]
    credential = len(DEVICE.key_id).to_bytes(2, "big") + DEVICE.key_id
    return draw(
        st.one_of(
            st.binary(max_size=200),
            mutated([genuine]),
            st.binary(max_size=120).map(lambda tail: _auth_data_prefix() + tail),
            cbor_documents.map(lambda key: _auth_data_prefix() + credential + key),
            st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=80)).map(
                lambda length_tail: _auth_data_prefix() + length_tail[0].to_bytes(2, "big") + length_tail[1]
            ),
            st.tuples(st.integers(0, 255), cbor_documents).map(
                lambda flags_extensions: genuine[:32] + bytes([flags_extensions[0]]) + genuine[33:] + flags_extensions[1]
            ),
        )
    )


@budget(120)
@given(auth_data=hostile_auth_data())
def test_certified_hostile_auth_data_gets_a_typed_verdict(auth_data: bytes) -> None:
    verdict = attestation_verdict(DEVICE.attest(CHALLENGE, auth_data=auth_data))
    assert verdict != "nonce_mismatch"  # certified: the checks behind the nonce ran
    if verdict == "accepted":
        assert auth_data[32 + 1 : 32 + 5] == bytes(4)


# Keys a certificate can carry: the device's own, another P-256 key, and types and curves
# App Attest never uses (generated once: RSA key generation is slow).
CERTIFIABLE_KEYS = {
    "device": DEVICE._private_key.public_key(),
    "other-p256": ec.generate_private_key(ec.SECP256R1()).public_key(),
    "p384": ec.generate_private_key(ec.SECP384R1()).public_key(),
    "secp256k1": ec.generate_private_key(ec.SECP256K1()).public_key(),
    "ed25519": ed25519.Ed25519PrivateKey.generate().public_key(),
    "rsa": rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key(),
}
extra_extensions = st.lists(
    st.tuples(
        st.builds(
            x509.UnrecognizedExtension,
            st.integers(1, 10**6).map(lambda arc: x509.ObjectIdentifier(f"1.3.6.1.4.1.55555.{arc}")),
            st.binary(max_size=40),
        ),
        st.booleans(),
    ),
    max_size=3,
    unique_by=lambda pair: pair[0].oid,
)


@budget(60)
@given(
    key_name=st.sampled_from(sorted(CERTIFIABLE_KEYS)),
    digital_signature=st.booleans(),
    omit_key_usage=st.booleans(),
    extensions=extra_extensions,
    issued_hours_from_now=st.integers(-100, 24),
)
# The edges of the validity window (a counter-example once: issued an hour ahead is still
# inside the day the CA backdates).
@example(key_name="device", digital_signature=True, omit_key_usage=False, extensions=[], issued_hours_from_now=1)
@example(key_name="device", digital_signature=True, omit_key_usage=False, extensions=[], issued_hours_from_now=24)
@example(key_name="device", digital_signature=True, omit_key_usage=False, extensions=[], issued_hours_from_now=-72)
@example(key_name="device", digital_signature=True, omit_key_usage=False, extensions=[], issued_hours_from_now=-73)
def test_certified_hostile_leaf_certificates_get_a_typed_verdict(
    key_name: str, digital_signature: bool, omit_key_usage: bool, extensions: list, issued_hours_from_now: int
) -> None:
    """Leaves the CA really signed, with wrong key types, missing or wrong key usage,
    unknown (even critical) extensions and any validity: the checks behind the chain."""
    leaf = CA.issue_credential_certificate(
        CERTIFIABLE_KEYS[key_name],
        NONCE,
        now=NOW + timedelta(hours=issued_hours_from_now),
        lifetime=timedelta(days=3),
        digital_signature=digital_signature,
        omit_key_usage=omit_key_usage,
        extra_extensions=tuple(extensions),
    )
    x5c = [certificate.public_bytes(serialization.Encoding.DER) for certificate in (leaf, CA.intermediate)]
    document = {**_genuine_parts(), "attStmt": {"x5c": x5c, "receipt": b""}}
    verdict = attestation_verdict(cbor2.dumps(document))
    if any(critical for _, critical in extensions):
        assert verdict == "chain_invalid"  # RFC 5280: an unhandled critical extension
        return
    # The validity window as issued (the CA backdates a day; DER times drop sub-seconds).
    in_validity = leaf.not_valid_before_utc <= NOW <= leaf.not_valid_after_utc
    valid_leaf = digital_signature and not omit_key_usage and in_validity
    if key_name == "device" and valid_leaf:
        assert verdict == "accepted"
    elif key_name == "device" and digital_signature and not omit_key_usage:
        assert verdict == "certificate_expired"
    else:
        assert verdict in ATTESTATION_REASONS


@st.composite
def nonce_extension_values(draw: st.DrawFn, genuine: bytes) -> bytes:
    return draw(st.one_of(st.just(genuine), mutated([genuine]), st.binary(max_size=64), cbor_documents))




@budget(120)
@given(extension=nonce_extension_values(GENUINE_EXTENSION))
def test_certified_nonce_extension_is_accepted_exactly_when_it_is_the_der_of_the_nonce(extension: bytes) -> None:
    verdict = attestation_verdict(DEVICE.attest(CHALLENGE, nonce_extension_der=extension))
    assert verdict == ("accepted" if extension == GENUINE_EXTENSION else "nonce_mismatch")


try:  # cryptography >= 47; its API is not yet stable, so tests use it only as a witness
    from cryptography.hazmat import asn1
except ImportError:  # pragma: no cover
    asn1 = None
else:

    @asn1.sequence
    class _NonceExtension:
        nonce: Annotated[bytes, asn1.Explicit(1)]


def _strict_der_nonce(extension: bytes) -> bytes | None:
    """An independent reading with cryptography's declarative DER decoder (strict DER)."""
    try:
        return asn1.decode_der(_NonceExtension, extension).nonce
    except ValueError:
        return None


@budget(400)
@given(extension=nonce_extension_values(GENUINE_EXTENSION))
def test_whole_value_comparison_agrees_with_a_strict_der_decoder(extension: bytes) -> None:
    """Comparing the whole extension value with the DER of the expected nonce accepts
    exactly what a strict DER decoder reads as that nonce (DER has one encoding per value)."""
    if asn1 is None:
        pytest.skip("cryptography.hazmat.asn1 needs cryptography >= 47")
    compared = extension == GENUINE_EXTENSION
    assert compared == (_strict_der_nonce(extension) == NONCE)


@budget(300)
@given(
    assertion_object=assertion_inputs,
    client_data_hash=st.one_of(st.just(hashlib.sha256(b"{}").digest()), st.binary(max_size=40)),
    app_id=st.one_of(st.just(DEVICE.app_id), texts),
    stored_counter=st.integers(min_value=0, max_value=2**32),
)
def test_any_assertion_gets_a_typed_verdict(
    assertion_object: bytes, client_data_hash: bytes, app_id: str, stored_counter: int
) -> None:
    try:
        counter = verify_assertion(
            assertion_object=assertion_object,
            client_data_hash=client_data_hash,
            public_key_pem=DEVICE.public_key_pem,
            app_id=app_id,
            stored_counter=stored_counter,
        )
    except AssertionInvalid as rejected:
        assert rejected.reason in ASSERTION_REASONS
    else:
        assert counter > stored_counter
        assert cbor2.loads(assertion_object)["authenticatorData"] == cbor2.loads(GENUINE_ASSERTION)["authenticatorData"]


def test_the_seeds_themselves_verify() -> None:
    """The mutation seeds are genuine, so what the properties mutate starts out valid."""
    assert attestation_verdict(GENUINE_ATTESTATION) == "accepted"
    pem = DEVICE.public_key_pem.encode()
    assert serialization.load_pem_public_key(pem)
    assert (
        verify_assertion(
            assertion_object=GENUINE_ASSERTION,
            client_data_hash=hashlib.sha256(b"{}").digest(),
            public_key_pem=DEVICE.public_key_pem,
            app_id=DEVICE.app_id,
            stored_counter=0,
        )
        == 1
    )
