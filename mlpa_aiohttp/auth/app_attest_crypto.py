"""Apple App Attest verification: attestation (once per key) and assertion (per request).

Follows Apple's "Validating apps that connect to your server" (summarised in compatibility.md §2.5).
Everything here is pure: bytes, keys, certificates and a clock value in, a verdict out.
Each defect raises `AttestationInvalid` / `AssertionInvalid` carrying a short machine
reason suitable for a metric label or a log field (never a secret); no other exception
escapes for any input bytes (the property tests in tests/unit/test_app_attest_fuzz.py).

Both checks take the `clientDataHash` the app handed to the device, as Apple's guide
formulates them; how a request derives it (SHA-256 of the challenge, or of the body) is
the caller's business (auth/app_attest.py).
"""

from __future__ import annotations

import hashlib
import hmac
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import cbor2
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID, ObjectIdentifier

NONCE_EXTENSION_OID = ObjectIdentifier("1.2.840.113635.100.8.2")
ATTESTATION_FORMAT = "apple-appattest"
AAGUID_PRODUCTION = b"appattest" + b"\x00" * 7
AAGUID_DEVELOPMENT = b"appattestdevelop"

# authData layout (WebAuthn authenticator data, as App Attest uses it).
_RP_ID_HASH_END = 32
_FLAGS_END = 33
_COUNTER_END = 37
_AAGUID_END = 53
_CREDENTIAL_ID_LENGTH_END = 55

# The nonce extension's value is DER: SEQUENCE { [1] EXPLICIT OCTET STRING (32 bytes) }.
# DER has exactly one encoding per value, so the certified value must be these six bytes
# followed by the nonce we compute; comparing the whole value leaves nothing to parse.
_NONCE_EXTENSION_PREFIX = bytes.fromhex("3024" "a122" "0420")
# The reference's QA tooling writes six zero bytes before the nonce instead (its verifier
# skips the first six bytes unread). Accepted only for QA attestations (`qa_tooling`).
_QA_TOOLING_NONCE_PREFIX = bytes(6)

# COSE_Key labels and the only values App Attest uses (RFC 9053: EC2, ES256, P-256).
_COSE_KTY, _COSE_ALG, _COSE_CRV, _COSE_X, _COSE_Y = 1, 3, -1, -2, -3
_COSE_KTY_EC2, _COSE_ALG_ES256, _COSE_CRV_P256 = 2, -7, 1
_P256_COORDINATE_LENGTH = 32

# Apple sends [credential certificate, intermediate]; a little slack costs nothing.
_MAX_CHAIN_LENGTH = 4
# The critical extensions the chain check acts on; any other critical one is refused.
_HANDLED_CRITICAL = frozenset({ExtensionOID.BASIC_CONSTRAINTS, ExtensionOID.KEY_USAGE})

_ROOT_RESOURCE = "Apple_App_Attestation_Root_CA.pem"


class AttestationInvalid(ValueError):
    """The attestation object fails one of Apple's checks; `reason` names which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AssertionInvalid(ValueError):
    """The assertion fails signature, RP-ID or counter checks; `reason` names which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StoredKeyInvalid(ValueError):
    """The public key we stored ourselves does not load: a server fault, not the client's."""


@dataclass(frozen=True, slots=True)
class AttestedKey:
    """What an accepted attestation yields for storage."""

    public_key_pem: str
    counter: int


def load_root(pem_bytes: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem_bytes)


def production_root() -> x509.Certificate:
    """Apple's App Attestation Root CA, shipped inside the package."""
    pem = resources.files("mlpa_aiohttp").joinpath("data", _ROOT_RESOURCE).read_bytes()
    return load_root(pem)


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# --------------------------------------------------------------------------- attestation


def verify_attestation(
    *,
    attestation_object: bytes,
    client_data_hash: bytes,
    key_id: bytes,
    app_id: str,
    production: bool,
    root: x509.Certificate,
    now: datetime,
    qa_tooling: bool = False,
) -> AttestedKey:
    """Run Apple's attestation checks, in Apple's order; return the key to store.

    `client_data_hash` is what the app passed to `attestKey(_:clientDataHash:)`: Apple's
    own samples pass the raw challenge bytes, the reference's clients SHA-256(challenge).
    Authenticity comes first: any change to authData shows as `nonce_mismatch`, before
    its fields are read.

    `qa_tooling` (only for the configured QA root, compatibility.md D54) accepts what the
    reference's QA tooling makes: `x5c` ending in `root` itself, and its nonce encoding.
    """
    statement = _decode_attestation_object(attestation_object)
    x5c: list[bytes] = statement["x5c"]
    if qa_tooling and len(x5c) > 1 and hmac.compare_digest(x5c[-1], root.public_bytes(serialization.Encoding.DER)):
        # The anchor is trusted by configuration: a copy of it in x5c is not an
        # intermediate, so its extensions (no BasicConstraints) are not examined.
        x5c = x5c[:-1]
    chain = _load_chain(x5c)
    _verify_chain(chain, root, _as_utc(now))
    credential_certificate = chain[0]
    auth_data: bytes = statement["authData"]

    # Steps 2-4: nonce = SHA-256(authData ‖ clientDataHash) must be the value Apple
    # certified in the credential certificate; this binds authData and the challenge.
    nonce = sha256(auth_data + client_data_hash)
    certified = _nonce_extension_value(credential_certificate)
    accepted = hmac.compare_digest(_NONCE_EXTENSION_PREFIX + nonce, certified)
    if qa_tooling:
        accepted |= hmac.compare_digest(_QA_TOOLING_NONCE_PREFIX + nonce, certified)
    if not accepted:
        raise AttestationInvalid("nonce_mismatch")

    # Step 5: the key id the app reports is the hash of the certified public key.
    certified_point = _p256_point(credential_certificate.public_key())
    if not hmac.compare_digest(sha256(certified_point), key_id):
        raise AttestationInvalid("key_id_mismatch")

    parsed = _parse_attested_auth_data(auth_data)
    if not _is_rp_id_hash_of(app_id, parsed.rp_id_hash):
        raise AttestationInvalid("rp_id_mismatch")
    if parsed.counter != 0:
        raise AttestationInvalid("counter_not_zero")
    accepted_aaguids = (AAGUID_PRODUCTION,) if production else (AAGUID_PRODUCTION, AAGUID_DEVELOPMENT)
    if parsed.aaguid not in accepted_aaguids:
        raise AttestationInvalid("aaguid_mismatch")
    if not hmac.compare_digest(parsed.credential_id, key_id):
        raise AttestationInvalid("key_id_mismatch")

    # Beyond Apple's list: the key we store must be the key Apple certified, otherwise
    # a crafted authData could smuggle in a key the Secure Enclave never held.
    public_key = _cose_p256_key(parsed.cose_key)
    if _p256_point(public_key) != certified_point:
        raise AttestationInvalid("public_key_mismatch")
    pem = public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")
    return AttestedKey(public_key_pem=pem, counter=parsed.counter)


def _decode_attestation_object(attestation_object: bytes) -> dict[str, Any]:
    try:
        decoded = cbor2.loads(attestation_object)
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise AttestationInvalid("malformed") from exc
    if not isinstance(decoded, dict):
        raise AttestationInvalid("malformed")
    if decoded.get("fmt") != ATTESTATION_FORMAT:
        raise AttestationInvalid("format_invalid")
    statement = decoded.get("attStmt")
    auth_data = decoded.get("authData")
    if not isinstance(statement, dict) or not isinstance(auth_data, bytes):
        raise AttestationInvalid("malformed")
    x5c = statement.get("x5c")
    if (
        not isinstance(x5c, list)
        or not 1 <= len(x5c) <= _MAX_CHAIN_LENGTH
        or not all(isinstance(der, bytes) for der in x5c)
    ):
        raise AttestationInvalid("malformed")
    return {"x5c": x5c, "authData": auth_data}


def _load_chain(x5c: list[bytes]) -> list[x509.Certificate]:
    """Parse the certificates, and their keys and extensions now: cryptography parses
    those lazily, and a defect found later would otherwise surface as an odd exception."""
    try:
        chain = [x509.load_der_x509_certificate(der) for der in x5c]
        for certificate in chain:
            certificate.public_key()
            certificate.extensions  # noqa: B018 - parsed now, not on first use
    except Exception as exc:  # cryptography's parse errors share no base class
        # (ValueError, UnsupportedAlgorithm, InvalidVersion, DuplicateExtension, ...)
        raise AttestationInvalid("malformed") from exc
    return chain


def _verify_chain(chain: list[x509.Certificate], root: x509.Certificate, now: datetime) -> None:
    """Each certificate is signed by the next, the last by `root`; all valid at `now`;
    each issuer a CA allowed to issue this deep; no critical extension left unhandled
    (RFC 5280 §4.2: Apple's chains mark only basic constraints and key usage critical).

    cryptography >= 45's `x509.verification` with custom extension policies also accepts
    all real Apple chains (docs/app-attest-verification.md); it is not used because its
    CA policy refuses the reference's QA root as an anchor (no BasicConstraints).
    """
    issuers = [*chain[1:], root]
    for depth, (certificate, issuer) in enumerate(zip(chain, issuers, strict=True)):
        try:
            certificate.verify_directly_issued_by(issuer)
        except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise AttestationInvalid("chain_invalid") from exc
        # `depth` intermediates stand between this issuer and the leaf.
        if issuer is not root and not _may_issue(issuer, intermediates_below=depth):
            raise AttestationInvalid("chain_invalid")
        if any(extension.critical and extension.oid not in _HANDLED_CRITICAL for extension in certificate.extensions):
            raise AttestationInvalid("chain_invalid")
    for certificate in [*chain, root]:
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise AttestationInvalid("certificate_expired")
    try:
        key_usage = chain[0].extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound as exc:
        raise AttestationInvalid("chain_invalid") from exc
    if not key_usage.digital_signature:
        raise AttestationInvalid("chain_invalid")


def _may_issue(certificate: x509.Certificate, *, intermediates_below: int) -> bool:
    extensions = certificate.extensions
    try:
        constraints = extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    if not constraints.ca or (constraints.path_length is not None and constraints.path_length < intermediates_below):
        return False
    try:
        return extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    except x509.ExtensionNotFound:
        return True


def _nonce_extension_value(certificate: x509.Certificate) -> bytes:
    """The raw DER value of Apple's nonce extension (an extension cryptography does not
    know, so it hands over the bytes untouched)."""
    try:
        extension = certificate.extensions.get_extension_for_oid(NONCE_EXTENSION_OID).value
    except x509.ExtensionNotFound as exc:
        raise AttestationInvalid("nonce_mismatch") from exc
    if not isinstance(extension, x509.UnrecognizedExtension):
        raise AttestationInvalid("nonce_mismatch")
    return extension.value


@dataclass(frozen=True, slots=True)
class _AttestedAuthData:
    rp_id_hash: bytes
    counter: int
    aaguid: bytes
    credential_id: bytes
    cose_key: Any


def _parse_attested_auth_data(auth_data: bytes) -> _AttestedAuthData:
    """rpIdHash(32) flags(1) counter(4) aaguid(16) idLength(2) credentialId COSE_Key [rest].

    Flags are not read: real devices set AT (0x40) and nothing else, and Apple's 2026
    sample carries CBOR extensions after the key without setting ED (0x80). The nonce has
    already bound every byte to Apple's signature, so whatever follows the key is Apple's
    and is ignored.
    """
    if len(auth_data) < _CREDENTIAL_ID_LENGTH_END:
        raise AttestationInvalid("malformed")
    credential_id_length = int.from_bytes(auth_data[_AAGUID_END:_CREDENTIAL_ID_LENGTH_END], "big")
    credential_id_end = _CREDENTIAL_ID_LENGTH_END + credential_id_length
    if len(auth_data) <= credential_id_end:
        raise AttestationInvalid("malformed")
    try:
        # Only the first CBOR item is the key; extension data may follow it.
        cose_key = cbor2.CBORDecoder(io.BytesIO(auth_data[credential_id_end:])).decode()
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise AttestationInvalid("malformed") from exc
    return _AttestedAuthData(
        rp_id_hash=auth_data[:_RP_ID_HASH_END],
        counter=int.from_bytes(auth_data[_FLAGS_END:_COUNTER_END], "big"),
        aaguid=auth_data[_COUNTER_END:_AAGUID_END],
        credential_id=auth_data[_CREDENTIAL_ID_LENGTH_END:credential_id_end],
        cose_key=cose_key,
    )


def _cose_p256_key(cose_key: Any) -> ec.EllipticCurvePublicKey:
    if not isinstance(cose_key, dict):
        raise AttestationInvalid("public_key_invalid")
    x, y = cose_key.get(_COSE_X), cose_key.get(_COSE_Y)
    if (
        cose_key.get(_COSE_KTY) != _COSE_KTY_EC2
        or cose_key.get(_COSE_CRV) != _COSE_CRV_P256
        # The reference only demanded kty and crv; an alg, when present, must be ES256.
        or cose_key.get(_COSE_ALG, _COSE_ALG_ES256) != _COSE_ALG_ES256
        or not isinstance(x, bytes)
        or not isinstance(y, bytes)
        or len(x) != _P256_COORDINATE_LENGTH
        or len(y) != _P256_COORDINATE_LENGTH
    ):
        raise AttestationInvalid("public_key_invalid")
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + x + y)
    except ValueError as exc:
        raise AttestationInvalid("public_key_invalid") from exc


def _p256_point(public_key: Any) -> bytes:
    """The 65-byte uncompressed point Apple hashes into the key id."""
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not isinstance(public_key.curve, ec.SECP256R1):
        raise AttestationInvalid("public_key_invalid")
    return public_key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


def _is_rp_id_hash_of(app_id: str, rp_id_hash: bytes) -> bool:
    """Whether authData names `app_id`. The app id's bundle part comes from the request and
    may hold lone surrogates (valid JSON escapes): no real app id has them, so they match
    nothing rather than failing to encode."""
    try:
        expected = sha256(app_id.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(rp_id_hash, expected)


def _as_utc(now: datetime) -> datetime:
    return now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)


# ----------------------------------------------------------------------------- assertion


def verify_assertion(
    *,
    assertion_object: bytes,
    client_data_hash: bytes,
    public_key_pem: str,
    app_id: str,
    stored_counter: int,
) -> int:
    """Run Apple's assertion checks; return the assertion's counter (to store next).

    What the device signs: Apple defines nonce = SHA-256(authenticatorData ‖ clientDataHash)
    and says the signature "is valid for nonce". The Secure Enclave signs that nonce as a
    *message* with ECDSA-P256-SHA256, so the digest inside the signature is SHA-256(nonce):
    the data is hashed twice. This is what the reference (pyattest) verifies against real
    devices, so it is what we verify and what our test device produces.
    """
    public_key = _load_stored_key(public_key_pem)
    try:
        decoded = cbor2.loads(assertion_object)
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise AssertionInvalid("malformed") from exc
    if not isinstance(decoded, dict):
        raise AssertionInvalid("malformed")
    authenticator_data = decoded.get("authenticatorData")
    signature = decoded.get("signature")
    if (
        not isinstance(authenticator_data, bytes)
        or not isinstance(signature, bytes)
        or len(authenticator_data) < _COUNTER_END
    ):
        raise AssertionInvalid("malformed")

    nonce = sha256(authenticator_data + client_data_hash)
    try:
        public_key.verify(signature, nonce, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise AssertionInvalid("signature_invalid") from exc

    # Apple's step 5. The reference skipped it; we check it so an assertion is only
    # accepted for the app id named in the request.
    if not _is_rp_id_hash_of(app_id, authenticator_data[:_RP_ID_HASH_END]):
        raise AssertionInvalid("rp_id_mismatch")
    counter = int.from_bytes(authenticator_data[_FLAGS_END:_COUNTER_END], "big")
    if counter <= stored_counter:
        raise AssertionInvalid("counter_not_increasing")
    return counter


def _load_stored_key(public_key_pem: str) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(public_key_pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise StoredKeyInvalid("stored public key does not load") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise StoredKeyInvalid("stored public key is not P-256")
    return key
