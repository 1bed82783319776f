"""`/verify/*`: App Attest challenge and attestation, Play Integrity token exchange."""

from __future__ import annotations

from aiohttp import web

from .. import keys
from ..errors import RequestInvalid, validation_error
from ..models import parse_bool_header


async def challenge(request: web.Request) -> web.Response:
    raw_key_id = request.query.get("key_id_b64")
    if raw_key_id is None:
        raise RequestInvalid([validation_error(("query", "key_id_b64"), "Field required", "missing")])
    issued = await request.app[keys.APP_ATTEST].issue_challenge(raw_key_id)
    return web.json_response({"challenge": issued})


async def attest(request: web.Request) -> web.Response:
    errors: list = []
    authorization = request.headers.get("authorization")
    if authorization is None:
        errors.append(validation_error(("header", "authorization"), "Field required", "missing"))
    use_qa = parse_bool_header(request.headers, "use-qa-certificates", errors)
    if errors or authorization is None:
        raise RequestInvalid(errors)
    await request.app[keys.APP_ATTEST].attest(authorization, use_qa=use_qa)
    return web.json_response({"status": "success"}, status=201)


async def play(request: web.Request) -> web.Response:
    # The body is JSON whatever Content-Type says (spec §5.1): we never look at it.
    grant = await request.app[keys.PLAY_INTEGRITY].exchange(await request.read())
    return web.json_response(grant)


def setup_verify_routes(app: web.Application) -> None:
    app.router.add_get("/verify/challenge", challenge)
    app.router.add_post("/verify/attest", attest)
    app.router.add_post("/verify/play", play)
