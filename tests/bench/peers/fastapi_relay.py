"""Reference peers: the FastAPI original's streaming relay shape, without auth.

Each stream forwards the request body to the upstream with httpx and relays the upstream's
bytes as they arrive. Like the original, every upstream read is raced against a disconnect
watcher: per chunk, `asyncio.wait({read_task, watcher}, FIRST_COMPLETED)`. The two peers
differ only in the watcher:

* `poll_peer`: asks `request.is_disconnected()` every 100 ms (the original's loop);
* `receive_peer`: awaits `request.receive()` until it yields `http.disconnect`.

Configured from the environment: BENCH_UPSTREAM_URL (chat completions URL) and
BENCH_UPSTREAM_KEY (bearer token the upstream expects). Run with one uvicorn worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

DisconnectWatcher = Callable[[Request], Awaitable[None]]

POLL_INTERVAL_SECONDS = 0.1


async def poll_until_disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(POLL_INTERVAL_SECONDS)


async def receive_until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def make_app(watch_disconnect: DisconnectWatcher) -> FastAPI:
    upstream_url = os.environ["BENCH_UPSTREAM_URL"]
    upstream_headers = {
        "authorization": f"Bearer {os.environ.get('BENCH_UPSTREAM_KEY', 'sk-test-virtual')}",
        "content-type": "application/json",
    }
    clients: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One pooled client, no connection cap (one connection per open stream), no read
        # timeout: the same allowances the aiohttp service gets.
        clients["upstream"] = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=1000, keepalive_expiry=4),
            timeout=httpx.Timeout(None, connect=10.0),
        )
        try:
            yield
        finally:
            await clients["upstream"].aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> StreamingResponse:
        body = await request.body()
        client = clients["upstream"]
        upstream = await client.send(
            client.build_request("POST", upstream_url, content=body, headers=upstream_headers), stream=True
        )

        async def relay() -> AsyncIterator[bytes]:
            watcher = asyncio.ensure_future(watch_disconnect(request))
            chunks = upstream.aiter_raw()
            try:
                while True:
                    read = asyncio.ensure_future(chunks.__anext__())
                    done, _ = await asyncio.wait({read, watcher}, return_when=asyncio.FIRST_COMPLETED)
                    if read not in done:  # the client went away first
                        read.cancel()
                        break
                    try:
                        chunk = read.result()
                    except StopAsyncIteration:
                        break
                    yield chunk
            finally:
                watcher.cancel()
                await upstream.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code, media_type="text/event-stream")

    return app
