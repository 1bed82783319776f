"""A fake Firefox Accounts OAuth server speaking FxA's wire protocol over loopback.

The base URL clients are given ends with `/v1` (`server.make_url("/v1")`), like
`https://oauth.accounts.firefox.com/v1`:

* `POST /v1/verify` `{"token": ...}` → 200 `{"user", "client_id", "scope": [...], "generation",
  "profile_changed_at"}` or 400 `{"code": 400, "errno": 108, "error": "Bad Request",
  "message": "Invalid token"}`; verifies opaque tokens registered with `add_opaque_token` and
  the JWTs this fake issued.
* `GET /v1/jwks` → `{"keys": [RSA public JWKs]}` of the published signing keys.

JWT access tokens from `issue_jwt` are signed RS256 with header `typ: at+jwt` and a `kid`,
like FxA's, so clients can verify them locally against the JWKS.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

__all__ = [
    "API_PREFIX",
    "DEFAULT_CLIENT_ID",
    "DEFAULT_ISSUER",
    "DEMO_TOKEN",
    "DEMO_UID",
    "FakeFxA",
    "TokenGrant",
    "run_fake_fxa",
    "serve_fake_fxa",
    "token_digest",
]

API_PREFIX = "/v1"
DEFAULT_ISSUER = "https://accounts.firefox.com"
DEFAULT_CLIENT_ID = "5f2b8a9c1d3e4f60"
DEMO_TOKEN = "demo-token"
DEMO_UID = "demo-user"

VerifyDelay = float | Callable[[str], float]


def token_digest(token: str) -> str:
    """How the fake remembers tokens in its counters (never the token itself)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """What `/v1/verify` answers for a valid token."""

    uid: str
    scopes: tuple[str, ...]
    client_id: str
    generation: int = 1
    profile_changed_at: int = 0

    def verify_body(self) -> dict[str, Any]:
        return {
            "user": self.uid,
            "client_id": self.client_id,
            "scope": list(self.scopes),
            "generation": self.generation,
            "profile_changed_at": self.profile_changed_at,
        }


@dataclass(eq=False, slots=True)
class _SigningKey:
    kid: str
    private_key: rsa.RSAPrivateKey
    published: bool

    def public_jwk(self) -> dict[str, Any]:
        jwk: dict[str, Any] = RSAAlgorithm.to_jwk(self.private_key.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}


def _fxa_error(status: int, errno: int, error: str, message: str) -> web.Response:
    return web.json_response(
        {"code": status, "errno": errno, "error": error, "message": message}, status=status
    )


class FakeFxA:
    """Keys, tokens and counters of one fake FxA OAuth server; `make_app()` serves it."""

    def __init__(
        self,
        *,
        issuer: str = DEFAULT_ISSUER,
        client_id: str = DEFAULT_CLIENT_ID,
        key_size: int = 2048,
        verify_delay: VerifyDelay = 0.0,
        jwks_delay: float = 0.0,
        register_demo_token: bool = True,
        first_key: rsa.RSAPrivateKey | None = None,
    ) -> None:
        """`first_key`: the private key of the first key id, instead of a new one (making a
        2048-bit key takes tens of milliseconds of CPU; a test suite shares one)."""
        self.issuer = issuer
        self.client_id = client_id
        self.key_size = key_size
        # Seconds before /v1/verify answers, or a function of the token (per-token delays).
        self.verify_delay: VerifyDelay = verify_delay
        self.jwks_delay = jwks_delay
        self.down = False  # both endpoints answer 503
        self.jwks_fetches = 0
        self.verify_calls: list[str] = []  # token_digest() of each /v1/verify call, in order
        self.opaque_tokens: dict[str, TokenGrant] = {}
        self.revoked: set[str] = set()  # token digests
        self.demo_token = DEMO_TOKEN
        self._keys: dict[str, _SigningKey] = {}
        self._kid_serial = itertools.count(1)
        self._current_kid = self.new_key(private_key=first_key)
        if register_demo_token:
            self.add_opaque_token(DEMO_TOKEN, DEMO_UID)

    # ---- keys -----------------------------------------------------------------------------

    @property
    def current_kid(self) -> str:
        return self._current_kid

    @property
    def published_kids(self) -> list[str]:
        return [key.kid for key in self._keys.values() if key.published]

    def new_key(
        self, *, publish: bool = True, make_current: bool = False, private_key: rsa.RSAPrivateKey | None = None
    ) -> str:
        """A new key id with a new RSA key (or `private_key`); unpublished keys sign tokens
        the JWKS can't verify yet."""
        kid = f"fake-{next(self._kid_serial)}-{secrets.token_hex(4)}"
        if private_key is None:
            private_key = rsa.generate_private_key(public_exponent=65537, key_size=self.key_size)
        self._keys[kid] = _SigningKey(kid, private_key, publish)
        if make_current:
            self._current_kid = kid
        return kid

    def rotate_key(self, *, drop_old: bool = False, publish: bool = True) -> str:
        """A new signing key; old keys stay unless `drop_old` (then their tokens stop verifying)."""
        if drop_old:
            self._keys.clear()
        return self.new_key(publish=publish, make_current=True)

    def publish_key(self, kid: str) -> None:
        self._keys[kid].published = True

    def unpublish_key(self, kid: str) -> None:
        self._keys[kid].published = False

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.public_jwk() for key in self._keys.values() if key.published]}

    # ---- tokens ---------------------------------------------------------------------------

    def issue_jwt(
        self,
        uid: str,
        scopes: Iterable[str] = ("profile:uid",),
        *,
        expires_in: float = 3600,
        kid: str | None = None,
        typ: str | None = "at+jwt",
        client_id: str | None = None,
        audience: str | None = None,
        extra_claims: Mapping[str, Any] | None = None,
    ) -> str:
        """An RS256 access token shaped like FxA's; negative `expires_in` gives an expired one."""
        key = self._keys[kid or self._current_kid]
        now = int(time.time())
        client = client_id or self.client_id
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": uid,
            "aud": audience or client,
            "client_id": client,
            "scope": " ".join(scopes),
            "iat": now,
            "exp": now + int(expires_in),
            "jti": uuid.uuid4().hex,
            **(extra_claims or {}),
        }
        return jwt.encode(
            claims, key.private_key, algorithm="RS256", headers={"kid": key.kid, "typ": typ}
        )

    def add_opaque_token(
        self,
        token: str,
        uid: str,
        scopes: Iterable[str] = ("profile:uid",),
        *,
        client_id: str | None = None,
    ) -> str:
        """Register a non-JWT token: only `/v1/verify` can tell who it belongs to."""
        self.opaque_tokens[token] = TokenGrant(uid, tuple(scopes), client_id or self.client_id)
        return token

    def revoke(self, token: str) -> None:
        self.revoked.add(token_digest(token))

    def verify_count(self, token: str) -> int:
        digest = token_digest(token)
        return sum(1 for call in self.verify_calls if call == digest)

    def reset_counters(self) -> None:
        self.jwks_fetches = 0
        self.verify_calls.clear()

    def grant_for(self, token: str) -> TokenGrant | None:
        """What the real server would say about `token`: its grant, or None if invalid."""
        if token_digest(token) in self.revoked:
            return None
        grant = self.opaque_tokens.get(token)
        if grant is not None:
            return grant
        return self._jwt_grant(token)

    def _jwt_grant(self, token: str) -> TokenGrant | None:
        try:
            key = self._keys.get(str(jwt.get_unverified_header(token).get("kid")))
            if key is None:
                return None
            claims = jwt.decode(
                token,
                key.private_key.public_key(),
                algorithms=["RS256"],
                issuer=self.issuer,
                options={"verify_aud": False, "require": ["exp", "sub", "scope", "client_id"]},
            )
        except jwt.PyJWTError:
            return None
        return TokenGrant(
            str(claims["sub"]), tuple(str(claims["scope"]).split()), str(claims["client_id"])
        )

    # ---- HTTP -----------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        # handler_cancellation: a delayed verify ends when the client gives up.
        app = web.Application(handler_args={"handler_cancellation": True})
        app.router.add_post(f"{API_PREFIX}/verify", self._handle_verify)
        app.router.add_get(f"{API_PREFIX}/jwks", self._handle_jwks)
        return app

    @staticmethod
    def _unavailable() -> web.Response:
        return _fxa_error(503, 201, "Service Unavailable", "Service unavailable")

    async def _handle_verify(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str):
            token = None
        self.verify_calls.append(token_digest(token) if token is not None else "")
        if self.down:
            return self._unavailable()
        delay = self.verify_delay(token or "") if callable(self.verify_delay) else self.verify_delay
        if delay > 0:
            await asyncio.sleep(delay)
        if not token:
            return _fxa_error(400, 109, "Bad Request", "Invalid request parameter")
        grant = self.grant_for(token)
        if grant is None:
            return _fxa_error(400, 108, "Bad Request", "Invalid token")
        return web.json_response(grant.verify_body())

    async def _handle_jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        if self.down:
            return self._unavailable()
        if self.jwks_delay > 0:
            await asyncio.sleep(self.jwks_delay)
        return web.json_response(self.jwks())


async def serve_fake_fxa(
    fake: FakeFxA,
    host: str = "127.0.0.1",
    port: int = 9010,
    *,
    on_started: Callable[[str], None] | None = None,
) -> None:
    """Serve `fake` until cancelled. `on_started` receives the base URL (ending in /v1)."""
    runner = web.AppRunner(fake.make_app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        if on_started is not None:
            bound_port = runner.addresses[0][1] if runner.addresses else port
            on_started(f"http://{host}:{bound_port}{API_PREFIX}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def run_fake_fxa(
    host: str = "127.0.0.1", port: int = 9010, *, on_started: Callable[[str], None] | None = None
) -> None:
    """A fake FxA knowing `DEMO_TOKEN`, until cancelled (for the demo)."""
    await serve_fake_fxa(FakeFxA(), host, port, on_started=on_started)
