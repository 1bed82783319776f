"""The fake FxA OAuth server, driven over real loopback HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from mlpa_aiohttp.testing.fake_fxa import (
    DEFAULT_CLIENT_ID,
    DEMO_TOKEN,
    DEMO_UID,
    FakeFxA,
    run_fake_fxa,
    token_digest,
)

ServerFactory = Callable[..., Awaitable[TestServer]]

INVALID_TOKEN_BODY = {"code": 400, "errno": 108, "error": "Bad Request", "message": "Invalid token"}


@pytest.fixture(scope="module")
def shared_fake() -> FakeFxA:
    # RSA key generation costs ~50 ms: tests that don't touch keys share one fake.
    return FakeFxA()


@pytest.fixture
def fake(shared_fake: FakeFxA) -> FakeFxA:
    shared_fake.reset_counters()
    shared_fake.down = False
    shared_fake.verify_delay = 0.0
    return shared_fake


@pytest.fixture
async def server(fake: FakeFxA, aiohttp_server: ServerFactory) -> TestServer:
    return await aiohttp_server(fake.make_app())


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session


async def fetch_jwks(session: aiohttp.ClientSession, server: TestServer) -> dict[str, Any]:
    async with session.get(server.make_url("/v1/jwks")) as resp:
        assert resp.status == 200
        jwks: dict[str, Any] = await resp.json()
        return jwks


async def verify(
    session: aiohttp.ClientSession, server: TestServer, token: Any
) -> tuple[int, dict[str, Any]]:
    async with session.post(server.make_url("/v1/verify"), json={"token": token}) as resp:
        return resp.status, await resp.json()


def decode_with_jwks(
    token: str, jwks: dict[str, Any], issuer: str = "https://accounts.firefox.com"
) -> dict[str, Any]:
    """Local verification the way an FxA client does it: pick the JWK by kid, check RS256 + typ."""
    header = jwt.get_unverified_header(token)
    assert header["typ"] == "at+jwt"
    matching = [jwk for jwk in jwks["keys"] if jwk["kid"] == header["kid"]]
    if not matching:
        raise LookupError(header["kid"])
    public_key = RSAAlgorithm.from_jwk(matching[0])
    assert isinstance(public_key, rsa.RSAPublicKey)  # never a private key in the JWKS
    claims: dict[str, Any] = jwt.decode(
        token, public_key, algorithms=["RS256"], issuer=issuer, options={"verify_aud": False}
    )
    return claims


# ---- JWKS and JWTs ------------------------------------------------------------------------------


async def test_jwks_publishes_rsa_signing_keys(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    jwks = await fetch_jwks(session, server)
    (key,) = jwks["keys"]
    assert key["kty"] == "RSA" and key["use"] == "sig" and key["alg"] == "RS256"
    assert key["kid"] == fake.current_kid
    assert key["e"] == "AQAB" and len(key["n"]) > 300
    assert "d" not in key  # public part only
    assert fake.jwks_fetches == 1


async def test_issued_jwt_verifies_locally_with_fxa_claims(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    before = int(time.time())
    token = fake.issue_jwt("uid-123", ("profile:uid", "https://identity.mozilla.com/apps/vpn"))
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "RS256", "kid": fake.current_kid, "typ": "at+jwt"}
    claims = decode_with_jwks(token, await fetch_jwks(session, server))
    assert claims["iss"] == "https://accounts.firefox.com"
    assert claims["sub"] == "uid-123"
    assert claims["client_id"] == DEFAULT_CLIENT_ID == claims["aud"]
    assert claims["scope"] == "profile:uid https://identity.mozilla.com/apps/vpn"
    assert before <= claims["iat"] <= claims["exp"] - 3600 + 1
    assert (
        claims["jti"]
        and claims["jti"]
        != jwt.decode(fake.issue_jwt("uid-123"), options={"verify_signature": False})["jti"]
    )


async def test_jwt_knobs(fake: FakeFxA) -> None:
    token = fake.issue_jwt("u", typ=None, client_id="abc", audience="https://resource.test")
    assert "typ" not in jwt.get_unverified_header(token)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert (claims["client_id"], claims["aud"]) == ("abc", "https://resource.test")
    assert jwt.get_unverified_header(fake.issue_jwt("u", typ="JWT"))["typ"] == "JWT"


async def test_expired_jwt_fails_locally_and_remotely(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    token = fake.issue_jwt("uid-1", expires_in=-60)
    with pytest.raises(jwt.ExpiredSignatureError):
        decode_with_jwks(token, await fetch_jwks(session, server))
    assert await verify(session, server, token) == (400, INVALID_TOKEN_BODY)


async def test_verify_accepts_issued_jwts(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    token = fake.issue_jwt("uid-9", ("profile:uid", "profile:email"))
    status, body = await verify(session, server, token)
    assert status == 200
    assert body == {
        "user": "uid-9",
        "client_id": DEFAULT_CLIENT_ID,
        "scope": ["profile:uid", "profile:email"],
        "generation": 1,
        "profile_changed_at": 0,
    }


async def test_verify_rejects_a_tampered_jwt(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    header, _, signature = fake.issue_jwt("uid-9").split(".")
    forged_payload = jwt.utils.base64url_encode(
        b'{"sub":"admin","scope":"profile:uid","client_id":"x","exp":9999999999}'
    )
    assert await verify(session, server, f"{header}.{forged_payload.decode()}.{signature}") == (
        400,
        INVALID_TOKEN_BODY,
    )


# ---- opaque tokens ------------------------------------------------------------------------------


async def test_opaque_tokens_verify_only_remotely(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    token = fake.add_opaque_token(
        "0f" * 32, "uid-opaque", ("profile:uid", "extra:scope"), client_id="c1"
    )
    with pytest.raises(jwt.DecodeError):
        jwt.get_unverified_header(token)
    status, body = await verify(session, server, token)
    assert status == 200
    assert (body["user"], body["scope"], body["client_id"]) == (
        "uid-opaque",
        ["profile:uid", "extra:scope"],
        "c1",
    )
    assert await verify(session, server, "no-such-token") == (400, INVALID_TOKEN_BODY)


async def test_demo_token_is_registered(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    assert fake.demo_token == DEMO_TOKEN == "demo-token"
    status, body = await verify(session, server, DEMO_TOKEN)
    assert (status, body["user"], body["scope"]) == (200, DEMO_UID, ["profile:uid"])


async def test_demo_token_can_be_left_out(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    server = await aiohttp_server(FakeFxA(register_demo_token=False).make_app())
    assert (await verify(session, server, DEMO_TOKEN))[0] == 400


async def test_revoked_tokens_fail(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    jwt_token = fake.issue_jwt("uid-r")
    opaque = fake.add_opaque_token("revoke-me", "uid-r")
    fake.revoke(jwt_token)
    fake.revoke(opaque)
    assert (await verify(session, server, jwt_token))[0] == 400
    assert (await verify(session, server, opaque))[0] == 400


async def test_malformed_verify_request(server: TestServer, session: aiohttp.ClientSession) -> None:
    status, body = await verify(session, server, 42)
    assert (status, body["errno"]) == (400, 109)
    async with session.post(server.make_url("/v1/verify"), data=b"not json") as resp:
        assert resp.status == 400


# ---- counters, delays, outage -------------------------------------------------------------------


async def test_verify_calls_are_counted_by_token_digest(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    await verify(session, server, DEMO_TOKEN)
    await verify(session, server, DEMO_TOKEN)
    await verify(session, server, "other")
    assert fake.verify_calls == [token_digest(DEMO_TOKEN)] * 2 + [token_digest("other")]
    assert fake.verify_count(DEMO_TOKEN) == 2
    assert DEMO_TOKEN not in fake.verify_calls
    fake.reset_counters()
    assert fake.verify_count(DEMO_TOKEN) == 0


async def test_verify_delay_per_token(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    """Only the slow token waits: sent first, its answer still comes after the other one's."""
    slow = fake.add_opaque_token("slow-token", "uid-slow")
    fake.verify_delay = lambda token: 0.3 if token == slow else 0.0
    answered: list[str] = []

    async def answer(token: str) -> None:
        assert (await verify(session, server, token))[0] == 200
        answered.append(token)

    slow_one = asyncio.ensure_future(answer(slow))
    await asyncio.sleep(0)  # the slow request goes out first
    await answer(DEMO_TOKEN)
    assert answered == [DEMO_TOKEN] and not slow_one.done()
    await slow_one
    assert answered == [DEMO_TOKEN, slow]


async def test_verify_delay_constant(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    """The delay holds `/verify` only: a JWKS fetch sent after it is answered before it."""
    fake.verify_delay = 0.2
    answered: list[str] = []

    async def verified() -> None:
        await verify(session, server, DEMO_TOKEN)
        answered.append("verify")

    pending = asyncio.ensure_future(verified())
    await asyncio.sleep(0)
    await fetch_jwks(session, server)
    answered.append("jwks")
    assert not pending.done()
    await pending
    assert answered == ["jwks", "verify"]


async def test_down_answers_503_everywhere(
    fake: FakeFxA, server: TestServer, session: aiohttp.ClientSession
) -> None:
    fake.down = True
    status, body = await verify(session, server, DEMO_TOKEN)
    assert (status, body["code"]) == (503, 503)
    async with session.get(server.make_url("/v1/jwks")) as resp:
        assert resp.status == 503
    assert (fake.verify_count(DEMO_TOKEN), fake.jwks_fetches) == (1, 1)
    fake.down = False
    assert (await verify(session, server, DEMO_TOKEN))[0] == 200


# ---- key rotation -------------------------------------------------------------------------------


async def test_rotation_keeps_old_keys_unless_dropped(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    fake = FakeFxA()
    server = await aiohttp_server(fake.make_app())
    old_kid = fake.current_kid
    old_token = fake.issue_jwt("uid-old")
    new_kid = fake.rotate_key()
    assert new_kid != old_kid and fake.current_kid == new_kid
    new_token = fake.issue_jwt("uid-new")
    assert jwt.get_unverified_header(new_token)["kid"] == new_kid

    jwks = await fetch_jwks(session, server)
    assert {k["kid"] for k in jwks["keys"]} == {old_kid, new_kid}
    assert decode_with_jwks(old_token, jwks)["sub"] == "uid-old"
    assert decode_with_jwks(new_token, jwks)["sub"] == "uid-new"

    newest_kid = fake.rotate_key(drop_old=True)
    jwks = await fetch_jwks(session, server)
    assert [k["kid"] for k in jwks["keys"]] == [newest_kid]
    with pytest.raises(LookupError):
        decode_with_jwks(new_token, jwks)
    assert (await verify(session, server, new_token))[0] == 400
    assert (await verify(session, server, fake.issue_jwt("uid-newest")))[0] == 200


async def test_unpublished_kid_then_published_needs_a_refetch(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    fake = FakeFxA()
    server = await aiohttp_server(fake.make_app())
    cached_jwks = await fetch_jwks(session, server)

    kid = fake.new_key(publish=False)
    token = fake.issue_jwt("uid-early", kid=kid)
    assert jwt.get_unverified_header(token)["kid"] == kid
    assert fake.current_kid != kid  # the old key still signs by default
    assert kid not in {k["kid"] for k in (await fetch_jwks(session, server))["keys"]}
    with pytest.raises(LookupError):
        decode_with_jwks(token, cached_jwks)

    fake.publish_key(kid)
    assert decode_with_jwks(token, await fetch_jwks(session, server))["sub"] == "uid-early"
    assert fake.jwks_fetches == 3
    assert kid in fake.published_kids
    fake.unpublish_key(kid)
    assert kid not in fake.published_kids


async def test_rotate_to_unpublished_key(
    aiohttp_server: ServerFactory, session: aiohttp.ClientSession
) -> None:
    fake = FakeFxA()
    server = await aiohttp_server(fake.make_app())
    fake.rotate_key(publish=False)
    token = fake.issue_jwt("uid-x")
    with pytest.raises(LookupError):
        decode_with_jwks(token, await fetch_jwks(session, server))
    assert (await verify(session, server, token))[0] == 200  # the server itself knows the key


# ---- serving ------------------------------------------------------------------------------------


async def test_run_fake_fxa_serves_v1_until_cancelled(session: aiohttp.ClientSession) -> None:
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_fake_fxa("127.0.0.1", 0, on_started=started.set_result))
    try:
        base_url = await asyncio.wait_for(started, 5)
        assert base_url.endswith("/v1")
        async with session.post(f"{base_url}/verify", json={"token": DEMO_TOKEN}) as resp:
            assert (await resp.json())["user"] == DEMO_UID
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
