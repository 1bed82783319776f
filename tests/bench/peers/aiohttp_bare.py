"""The floor for an aiohttp relay: what aiohttp itself costs, measured next to the service.

No auth, no provisioning, no accounting, no metrics, no logging: the request body goes to
the upstream over one shared ClientSession and the answer comes back chunk by chunk through
a StreamResponse, with the service's server settings (uvloop, handler cancellation, no
access log). The service's figures minus these are what the service's own work costs.

    python -m tests.bench.peers.aiohttp_bare --port 9000 --upstream http://127.0.0.1:9001
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM_URL = web.AppKey("upstream_url", str)
UPSTREAM_HEADERS = {"Authorization": "Bearer sk-test-virtual", "Content-Type": "application/json"}


async def shared_session(app: web.Application) -> AsyncIterator[None]:
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app[SESSION].close()


async def relay(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    body = await request.read()
    async with request.app[SESSION].post(request.app[UPSTREAM_URL], data=body, headers=UPSTREAM_HEADERS) as upstream:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    await response.write_eof()
    return response


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.peers.aiohttp_bare")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL")
    args = parser.parse_args()
    app = web.Application(handler_args={"handler_cancellation": True})
    app[UPSTREAM_URL] = args.upstream + "/v1/chat/completions"
    app.cleanup_ctx.append(shared_session)
    app.router.add_post("/v1/chat/completions", relay)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, backlog=4096,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
