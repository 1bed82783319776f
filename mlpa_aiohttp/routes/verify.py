"""`/verify/*`: App Attest challenge and attestation, Play Integrity token exchange."""

from __future__ import annotations

from aiohttp import web

from .. import keys
from ..errors import RequestInvalid
from ..models import AttestHeaders, ChallengeQuery, parse_headers, parse_query
from ..validation import Problem


async def challenge(request: web.Request) -> web.Response:
    problems: list[Problem] = []
    query = parse_query(ChallengeQuery, request.query, problems)
    if query is None:
        raise RequestInvalid(problems)
    issued = await request.app[keys.APP_ATTEST].issue_challenge(query.key_id_b64)
    return web.json_response({"challenge": issued})


async def attest(request: web.Request) -> web.Response:
    problems: list[Problem] = []
    headers = parse_headers(AttestHeaders, request.headers, problems)
    if headers is None:
        raise RequestInvalid(problems)
    await request.app[keys.APP_ATTEST].attest(headers.authorization, use_qa=headers.use_qa_certificates)
    return web.json_response({"status": "success"}, status=201)


async def play(request: web.Request) -> web.Response:
    # The body is JSON whatever Content-Type says (compatibility.md §5.1): we never look at it.
    grant = await request.app[keys.PLAY_INTEGRITY].exchange(await request.read())
    return web.json_response(grant)


def setup_verify_routes(app: web.Application) -> None:
    app.router.add_get("/verify/challenge", challenge)
    app.router.add_post("/verify/attest", attest)
    app.router.add_post("/verify/play", play)
