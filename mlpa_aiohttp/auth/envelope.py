"""The unsigned JWT envelope that carries App Attest credentials (compatibility.md §2.5).

iOS clients wrap their attestation / assertion in a JWT purely as a container: its
signature proves nothing (the key lives on the device and we have no copy), so the
payload is read with every JWT check disabled. What protects the request is the App
Attest cryptography inside the payload, verified by `app_attest_crypto`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Any

import jwt

from ..wire import is_credential_text

ATTESTATION_CLAIMS: tuple[str, ...] = ("key_id_b64", "challenge_b64", "attestation_obj_b64", "bundle_id")
ASSERTION_CLAIMS: tuple[str, ...] = ("key_id_b64", "challenge_b64", "assertion_obj_b64", "bundle_id")

MAX_KEY_ID_LENGTH = 128

_KEY_ID_ALPHABET = re.compile(r"[A-Za-z0-9+/=]+")
_BASE64_CORE = re.compile(r"[A-Za-z0-9+/_-]*")
_BEARER_PREFIX = "Bearer "


class EnvelopeInvalid(ValueError):
    """The Authorization value is not a parseable envelope with the required string claims."""


class Base64Invalid(ValueError):
    """A base64 field of the envelope does not decode."""


def decode_envelope(authorization: str, required_claims: Iterable[str]) -> dict[str, str]:
    """Return the listed claims of the JWT in `authorization` (with or without `Bearer `).

    Signature, exp, nbf, iat, aud and iss are deliberately not verified (see module doc);
    the header must still name an algorithm PyJWT knows, as the reference required.
    """
    token = authorization[len(_BEARER_PREFIX) :] if authorization.startswith(_BEARER_PREFIX) else authorization
    token = token.strip()
    if not token:
        raise EnvelopeInvalid("empty token")
    if not is_credential_text(token):
        raise EnvelopeInvalid("not visible ASCII")
    try:
        header = jwt.get_unverified_header(token)
        if header.get("alg") not in jwt.PyJWS().get_algorithms():
            raise EnvelopeInvalid("unrecognised alg")
        payload: Any = jwt.decode(
            token,
            options={
                "verify_signature": False,
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "verify_aud": False,
                "verify_iss": False,
                "verify_sub": False,
                "verify_jti": False,
            },
        )
    except jwt.PyJWTError as exc:
        raise EnvelopeInvalid("unparseable token") from exc
    if not isinstance(payload, dict):
        raise EnvelopeInvalid("payload is not an object")
    claims: dict[str, str] = {}
    for name in required_claims:
        value = payload.get(name)
        if not isinstance(value, str):
            raise EnvelopeInvalid(f"claim {name} missing or not a string")
        claims[name] = value
    return claims


def is_plausible_key_id(key_id_b64: str) -> bool:
    """Cheap shape check run before any database access (compatibility.md §1.4): standard base64 only."""
    return 0 < len(key_id_b64) <= MAX_KEY_ID_LENGTH and _KEY_ID_ALPHABET.fullmatch(key_id_b64) is not None


def decode_base64(text: str) -> bytes:
    """Decode standard or URL-safe base64 (either alphabet, even mixed), padding optional.

    Padding, when present, must be correct; any other character is rejected rather than
    skipped, so garbage cannot decode to something by accident.
    """
    core = text.rstrip("=")
    padding = len(text) - len(core)
    if _BASE64_CORE.fullmatch(core) is None or len(core) % 4 == 1:
        raise Base64Invalid("not base64")
    if padding and (len(text) % 4 != 0 or padding > 2):
        raise Base64Invalid("incorrect padding")
    normalised = core.replace("-", "+").replace("_", "/")
    normalised += "=" * (-len(normalised) % 4)
    try:
        return base64.b64decode(normalised, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Base64Invalid("not base64") from exc
