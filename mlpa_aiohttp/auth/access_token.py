"""Our own short-lived access token, issued after a Play Integrity check (compatibility.md §2.6).

Compact JWS, HS256 only, claims iss "mlpa", sub (the client's user id), iat, exp and
typ "mlpa_access". Unlike the reference we also check `typ`, so no other HS256 token
that happens to share the secret can pass as an access token.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import jwt

from ..wire import is_base_identity, is_credential_text

ISSUER = "mlpa"
TOKEN_TYPE = "mlpa_access"
ALGORITHM = "HS256"
LEEWAY_SECONDS = 5


class AccessTokenInvalid(ValueError):
    """Bad signature, wrong algorithm, expired, or a missing / wrong claim."""


def _epoch_seconds(now: datetime | float | None) -> float:
    if now is None:
        return time.time()
    if isinstance(now, datetime):
        return now.timestamp()
    return float(now)


def issue_access_token(secret: str, sub: str, ttl_seconds: int, now: datetime | float) -> str:
    issued_at = int(_epoch_seconds(now))
    claims = {"iss": ISSUER, "sub": sub, "iat": issued_at, "exp": issued_at + ttl_seconds, "typ": TOKEN_TYPE}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify_access_token(secret: str, token: str, now: datetime | float | None = None) -> str:
    """Return the token's `sub`, or raise `AccessTokenInvalid`."""
    if not is_credential_text(token):
        raise AccessTokenInvalid("not visible ASCII")
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            issuer=ISSUER,
            options={
                "require": ["exp", "sub", "iss"],
                # Time claims are checked below against the injectable clock instead.
                "verify_exp": False,
                "verify_iat": False,
                "verify_nbf": False,
            },
        )
    except jwt.PyJWTError as exc:
        raise AccessTokenInvalid(type(exc).__name__) from exc
    expiry = claims["exp"]
    if isinstance(expiry, bool) or not isinstance(expiry, (int, float)):
        raise AccessTokenInvalid("exp is not a number")
    if _epoch_seconds(now) > expiry + LEEWAY_SECONDS:
        raise AccessTokenInvalid("expired")
    if claims.get("typ") != TOKEN_TYPE:
        raise AccessTokenInvalid("wrong typ")
    subject = claims["sub"]
    if not isinstance(subject, str) or not is_base_identity(subject):
        # Also refuses tokens issued before user ids were checked (a NUL, a ':').
        raise AccessTokenInvalid("sub is not a valid user id")
    return subject
