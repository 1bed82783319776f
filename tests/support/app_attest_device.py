"""A software stand-in for an iOS device doing App Attest, for the tests.

`TestAttestationCA` plays Apple's attestation service (root + intermediate CA, P-384 like
Apple's); `TestDevice` plays the Secure Enclave key and the app: it produces real CBOR
attestation and assertion objects, signed under the test CA, that pass the production
verifier when that verifier is given `ca.root` instead of Apple's root. Keyword "defect"
knobs each break exactly one of Apple's checks so tests can prove every check runs.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import cbor2
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import NameOID

from mlpa_aiohttp.auth.app_attest_crypto import (
    AAGUID_DEVELOPMENT,
    AAGUID_PRODUCTION,
    ATTESTATION_FORMAT,
    NONCE_EXTENSION_OID,
)

# The envelope JWT's signature is ignored by the server; any key will do.
_ENVELOPE_SIGNING_KEY = "app-attest-envelope-test-key-not-checked"
# WebAuthn flags as real devices set them: attested credential data (AT), nothing else,
# in attestations and assertions alike (every real vector in shared/data/appattest-vectors).
_FLAGS_ATTESTATION = 0x40
_FLAGS_ASSERTION = 0x40
# Apple's receipts (a CMS blob for Apple's fraud-metric service, ignored by the server) are
# 3.7-4.0 KB in every real attestation; a realistic size keeps the Authorization header as
# large as a real device's (about 10.7 KB once base64'd into the JWT envelope).
REALISTIC_RECEIPT = b"\x30\x82\x0f\x9c" + bytes(3996)
# What Apple's 2026 sample carries after the credential key (with the ED flag still clear).
APPLE_2026_EXTENSIONS = cbor2.dumps({"apple_bundle_version_01": "1", "apple_validation_category_01": b"\x01\x00\x00\x00"})


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mlpa-aiohttp tests"),
        ]
    )


def encode_nonce_extension(nonce: bytes) -> bytes:
    """Apple's encoding: SEQUENCE { [1] EXPLICIT OCTET STRING nonce } (short DER lengths)."""
    octet_string = b"\x04" + bytes([len(nonce)]) + nonce
    explicit = b"\xa1" + bytes([len(octet_string)]) + octet_string
    return b"\x30" + bytes([len(explicit)]) + explicit


class TestAttestationCA:
    """An in-process root and intermediate CA shaped like Apple's App Attest hierarchy."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        *,
        name: str = "Test App Attestation",
        now: datetime | None = None,
        intermediate_is_ca: bool = True,
        intermediate_signs_certificates: bool = True,
    ) -> None:
        issued = now or datetime.now(UTC)
        self._root_key = ec.generate_private_key(ec.SECP384R1())
        self._intermediate_key = ec.generate_private_key(ec.SECP384R1())
        root_name = _name(f"{name} Root CA")
        self.root: x509.Certificate = (
            x509.CertificateBuilder()
            .subject_name(root_name)
            .issuer_name(root_name)
            .public_key(self._root_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(issued - timedelta(days=1))
            .not_valid_after(issued + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_ca_key_usage(), critical=True)
            .sign(self._root_key, hashes.SHA384())
        )
        self.intermediate: x509.Certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(f"{name} CA 1"))
            .issuer_name(root_name)
            .public_key(self._intermediate_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(issued - timedelta(days=1))
            .not_valid_after(issued + timedelta(days=3650))
            .add_extension(
                x509.BasicConstraints(ca=intermediate_is_ca, path_length=0 if intermediate_is_ca else None),
                critical=True,
            )
            .add_extension(_ca_key_usage(key_cert_sign=intermediate_signs_certificates), critical=True)
            .sign(self._root_key, hashes.SHA384())
        )

    @property
    def root_pem(self) -> bytes:
        return self.root.public_bytes(serialization.Encoding.PEM)

    def issue_credential_certificate(
        self,
        public_key: CertificatePublicKeyTypes,
        nonce: bytes,
        *,
        now: datetime | None = None,
        lifetime: timedelta = timedelta(days=3),
        digital_signature: bool = True,
        nonce_extension_der: bytes | None = None,
        omit_nonce_extension: bool = False,
        omit_key_usage: bool = False,
        extra_extensions: tuple[tuple[x509.ExtensionType, bool], ...] = (),
    ) -> x509.Certificate:
        """The leaf Apple issues per attestation: the device key plus the certified nonce.

        `nonce_extension_der` replaces the extension's DER value verbatim (parser tests);
        `public_key` may be of any type, `extra_extensions` are (value, critical) pairs.
        """
        issued = now or datetime.now(UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(_sha256(nonce).hex()))
            .issuer_name(self.intermediate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            # A day back, like the CA certificates above: tests verify at a clock fixed when
            # their module is imported, which a long suite leaves minutes behind `issued`.
            .not_valid_before(issued - timedelta(days=1))
            .not_valid_after(issued + lifetime)
        )
        for extension, critical in extra_extensions:
            builder = builder.add_extension(extension, critical=critical)
        if not omit_key_usage:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=digital_signature,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        if not omit_nonce_extension:
            extension_der = encode_nonce_extension(nonce) if nonce_extension_der is None else nonce_extension_der
            builder = builder.add_extension(
                x509.UnrecognizedExtension(NONCE_EXTENSION_OID, extension_der), critical=False
            )
        return builder.sign(self._intermediate_key, hashes.SHA256())


def _ca_key_usage(*, key_cert_sign: bool = True) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


class TestDevice:
    """One App Attest key on one simulated device, for app `{team_id}.{bundle_id}`."""

    __test__ = False

    def __init__(self, ca: TestAttestationCA, team_id: str, bundle_id: str, production: bool = False) -> None:
        self.ca = ca
        self.team_id = team_id
        self.bundle_id = bundle_id
        self.production = production
        self._private_key = ec.generate_private_key(ec.SECP256R1())
        self.public_point: bytes = self._private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )

    @property
    def app_id(self) -> str:
        return f"{self.team_id}.{self.bundle_id}"

    @property
    def key_id(self) -> bytes:
        return _sha256(self.public_point)

    @property
    def key_id_b64(self) -> str:
        return base64.b64encode(self.key_id).decode("ascii")

    @property
    def public_key_pem(self) -> str:
        return (
            self._private_key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode("ascii")
        )

    # ------------------------------------------------------------------ attestation

    def attest(
        self,
        challenge: bytes,
        *,
        wrong_nonce: bool = False,
        wrong_rp_id: bool = False,
        counter: int = 0,
        aaguid: bytes | None = None,
        wrong_key_id: bool = False,
        foreign_ca: bool = False,
        now: datetime | None = None,
        certified_public_key: ec.EllipticCurvePublicKey | None = None,
        other_cose_key: bool = False,
        auth_data: bytes | None = None,
        leaf_digital_signature: bool = True,
        nonce_extension_der: bytes | None = None,
        omit_nonce_extension: bool = False,
        extensions: bytes = b"",
        raw_client_data_hash: bool = False,
        receipt: bytes = REALISTIC_RECEIPT,
    ) -> bytes:
        """A CBOR attestation object for `challenge`, optionally with one defect.

        By default the app hashes the challenge (clientDataHash = SHA-256(challenge)), as
        the reference's clients do; `raw_client_data_hash` passes the challenge bytes as
        the clientDataHash, as Apple's samples do. `extensions` is appended to authData
        after the COSE key, as Apple's 2026 sample does.

        `wrong_key_id` puts a credential id other than the key id into authData (the
        certificate still certifies the right key); `certified_public_key` makes the
        certificate certify some other key (authData unchanged); `other_cose_key` puts
        another key into authData's COSE_Key; `auth_data` replaces authData verbatim
        (the nonce is still computed correctly over it).
        """
        rp_id = f"{self.app_id}.evil" if wrong_rp_id else self.app_id
        if aaguid is None:
            aaguid = AAGUID_PRODUCTION if self.production else AAGUID_DEVELOPMENT
        credential_id = _sha256(b"another key") if wrong_key_id else self.key_id
        cose_source = ec.generate_private_key(ec.SECP256R1()) if other_cose_key else self._private_key
        public_numbers = cose_source.public_key().public_numbers()
        cose_key = cbor2.dumps(
            {
                1: 2,  # kty: EC2
                3: -7,  # alg: ES256
                -1: 1,  # crv: P-256
                -2: public_numbers.x.to_bytes(32, "big"),
                -3: public_numbers.y.to_bytes(32, "big"),
            }
        )
        auth_data = auth_data if auth_data is not None else (
            _sha256(rp_id.encode("utf-8"))
            + bytes([_FLAGS_ATTESTATION])
            + counter.to_bytes(4, "big")
            + aaguid
            + len(credential_id).to_bytes(2, "big")
            + credential_id
            + cose_key
            + extensions
        )
        client_data_hash = challenge if raw_client_data_hash else _sha256(challenge)
        nonce = _sha256(auth_data + client_data_hash)
        if wrong_nonce:
            nonce = _sha256(nonce)
        ca = TestAttestationCA(name="Foreign", now=now) if foreign_ca else self.ca
        credential_certificate = ca.issue_credential_certificate(
            certified_public_key or self._private_key.public_key(),
            nonce,
            now=now,
            digital_signature=leaf_digital_signature,
            nonce_extension_der=nonce_extension_der,
            omit_nonce_extension=omit_nonce_extension,
        )
        return cbor2.dumps(
            {
                "fmt": ATTESTATION_FORMAT,
                "attStmt": {
                    "x5c": [
                        credential_certificate.public_bytes(serialization.Encoding.DER),
                        ca.intermediate.public_bytes(serialization.Encoding.DER),
                    ],
                    "receipt": receipt,
                },
                "authData": auth_data,
            }
        )

    # -------------------------------------------------------------------- assertion

    def assertion(
        self,
        client_data: bytes,
        counter: int,
        *,
        wrong_key: bool = False,
        rp_id: str | None = None,
    ) -> bytes:
        """A CBOR assertion over `client_data` (the raw request body).

        Signs exactly what a device signs: the message nonce = SHA-256(authenticatorData ‖
        SHA-256(client_data)) with ECDSA-P256-SHA256 (see `verify_assertion`).
        """
        authenticator_data = (
            _sha256((rp_id or self.app_id).encode("utf-8"))
            + bytes([_FLAGS_ASSERTION])
            + counter.to_bytes(4, "big")
        )
        nonce = _sha256(authenticator_data + _sha256(client_data))
        signing_key = ec.generate_private_key(ec.SECP256R1()) if wrong_key else self._private_key
        signature = signing_key.sign(nonce, ec.ECDSA(hashes.SHA256()))
        return cbor2.dumps({"signature": signature, "authenticatorData": authenticator_data})

    # ---------------------------------------------------------------- JWT envelopes

    def attestation_jwt(self, challenge_hex: str, **defects: Any) -> str:
        """The `Authorization` JWT for `POST /verify/attest` (without the Bearer prefix)."""
        challenge = challenge_hex.encode("utf-8")
        attestation = self.attest(challenge, **defects)
        return self._envelope(
            {
                "key_id_b64": self.key_id_b64,
                "challenge_b64": base64.b64encode(challenge).decode("ascii"),
                "attestation_obj_b64": base64.b64encode(attestation).decode("ascii"),
                "bundle_id": self.bundle_id,
            }
        )

    def assertion_jwt(
        self,
        challenge_hex: str,
        body: bytes,
        counter: int,
        *,
        wrong_key: bool = False,
        rp_id: str | None = None,
    ) -> str:
        """The `Authorization` JWT for a `use-app-attest: true` request carrying `body`."""
        assertion = self.assertion(body, counter, wrong_key=wrong_key, rp_id=rp_id)
        return self._envelope(
            {
                "key_id_b64": self.key_id_b64,
                "challenge_b64": base64.b64encode(challenge_hex.encode("utf-8")).decode("ascii"),
                "assertion_obj_b64": base64.b64encode(assertion).decode("ascii"),
                "bundle_id": self.bundle_id,
            }
        )

    @staticmethod
    def _envelope(payload: dict[str, str]) -> str:
        return jwt.encode(payload, _ENVELOPE_SIGNING_KEY, algorithm="HS256")


def compact_json(value: object) -> bytes:
    """Request bodies the way the QA client hashes them (compact, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# ------------------------------------------------------------------ the reference's QA tooling

QA_ROOT_KEY_PASSWORD = b"123"
# The reference's QA tooling writes six zero bytes, then the nonce (not Apple's DER form).
QA_TOOLING_NONCE_PREFIX = bytes(6)
APPLE_NONCE_PREFIX = encode_nonce_extension(bytes(32))[:6]


def _qa_key_usage() -> x509.KeyUsage:
    """The one KeyUsage the QA tooling puts on its root and its leaves alike."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


class QAToolingRoot:
    """The QA root the reference's QA tooling makes (spec mlpa-1.0.39 §A.17): self-signed
    RSA-2048, O=pyattest-testing-ca, SHA-256, valid 10 days, KeyUsage and no
    BasicConstraints; its key kept as PEM encrypted with the password `123`."""

    __test__ = False

    def __init__(self, *, now: datetime | None = None) -> None:
        issued = now or datetime.now(UTC)
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pyattest-testing-ca")])
        self.certificate: x509.Certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(issued)
            .not_valid_after(issued + timedelta(days=10))
            .add_extension(_qa_key_usage(), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.key_pem = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(QA_ROOT_KEY_PASSWORD),
        )

    @property
    def root_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue_leaf(self, public_key: ec.EllipticCurvePublicKey, nonce_extension_value: bytes) -> x509.Certificate:
        """O=pyattest-testing-leaf, valid from now for 10 days, signed with RSA PKCS#1 v1.5
        SHA-256 by the root key (read back from its encrypted PEM, as the tooling does)."""
        signing_key = serialization.load_pem_private_key(self.key_pem, password=QA_ROOT_KEY_PASSWORD)
        assert isinstance(signing_key, rsa.RSAPrivateKey)
        issued = datetime.now(UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pyattest-testing-leaf")]))
            .issuer_name(self.certificate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(issued)
            .not_valid_after(issued + timedelta(days=10))
            .add_extension(_qa_key_usage(), critical=False)
            .add_extension(x509.UnrecognizedExtension(NONCE_EXTENSION_OID, nonce_extension_value), critical=False)
            .sign(signing_key, hashes.SHA256())
        )


class QAToolingDevice(TestDevice):
    """A device key attested the way the reference's QA tooling attests it (§A.17):
    x5c = [leaf, QA root], an empty receipt, authData with flags 0x00, counter 0, AAGUID
    `appattestdevelop` and a COSE EC2 key, the nonce behind six zero bytes. Assertions and
    JWT envelopes are the ordinary device's."""

    __test__ = False

    def __init__(self, root: QAToolingRoot, team_id: str, bundle_id: str) -> None:
        # No Apple-like CA: the QA root signs the leaf itself.
        self.qa_root = root
        self.team_id = team_id
        self.bundle_id = bundle_id
        self.production = False
        self._private_key = ec.generate_private_key(ec.SECP256R1())
        self.public_point = self._private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )

    def attest(  # type: ignore[override]  # the QA tooling's knobs, not the Apple-like device's
        self,
        challenge: bytes,
        *,
        nonce_prefix: bytes = QA_TOOLING_NONCE_PREFIX,
        leaf_only: bool = False,
        extra_certificate: x509.Certificate | None = None,
    ) -> bytes:
        """The QA tooling's attestation object for `challenge` (its UTF-8 bytes, which the
        tooling hashes into the clientDataHash). Variants, one deviation each:
        `nonce_prefix` replaces the six zero bytes before the nonce (Apple's DER header:
        `APPLE_NONCE_PREFIX`), `leaf_only` leaves the root out of x5c, `extra_certificate`
        is sent last in x5c in the root's place."""
        numbers = self._private_key.public_key().public_numbers()
        cose_key = cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})
        auth_data = (
            _sha256(self.app_id.encode("utf-8"))
            + b"\x00"  # flags
            + (0).to_bytes(4, "big")  # counter
            + AAGUID_DEVELOPMENT
            + len(self.key_id).to_bytes(2, "big")
            + self.key_id
            + cose_key
        )
        nonce = _sha256(auth_data + _sha256(challenge))
        leaf = self.qa_root.issue_leaf(self._private_key.public_key(), nonce_prefix + nonce)
        x5c = [leaf.public_bytes(serialization.Encoding.DER)]
        if not leaf_only:
            last = extra_certificate or self.qa_root.certificate
            x5c.append(last.public_bytes(serialization.Encoding.DER))
        return cbor2.dumps({"fmt": ATTESTATION_FORMAT, "attStmt": {"x5c": x5c, "receipt": b""}, "authData": auth_data})
