"""Reference peers: the FastAPI original's streaming relay shape, without auth.

Each stream forwards the request body to the upstream with httpx and relays the upstream's
bytes as they arrive. Like the original, every upstream read is raced against a disconnect
watcher: per chunk, `asyncio.wait({read_task, watcher}, FIRST_COMPLETED)`. The watcher:

* `poll_peer`: asks `request.is_disconnected()` every 100 ms (the original's loop);
* `receive_peer`: awaits `request.receive()` until it yields `http.disconnect` (the fix).

Both carry the original's stack (`reference_stack.py`: its four http middlewares, per-chunk
inspection, metrics). `receive_bare_peer` is the receive() relay alone.

Configured from the environment: BENCH_UPSTREAM_URL (chat completions URL) and
BENCH_UPSTREAM_KEY (bearer token the upstream expects). Run with one uvicorn worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from . import reference_stack

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


def make_app(watch_disconnect: DisconnectWatcher, *, with_reference_stack: bool = True) -> FastAPI:
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
    if with_reference_stack:
        reference_stack.install_middlewares(app)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> StreamingResponse:
        started = time.perf_counter()
        body = await request.body()
        inspector: reference_stack.ChunkInspector | None = None
        if with_reference_stack:
            # The original validates the request and rebuilds the upstream body.
            payload = json.loads(body)
            payload["stream_options"] = {"include_usage": True}
            body = json.dumps(payload).encode()
            inspector = reference_stack.ChunkInspector(str(payload.get("model")), started)
        service_type = request.headers.get("service-type", "")
        purpose = request.headers.get("x-purpose", "-")
        client = clients["upstream"]
        upstream = await client.send(
            client.build_request("POST", upstream_url, content=body, headers=upstream_headers), stream=True
        )

        async def relay() -> AsyncIterator[bytes]:
            watcher = asyncio.ensure_future(watch_disconnect(request))
            chunks = upstream.aiter_raw()
            result = "abort"
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
                        result = "success"
                        break
                    if inspector is not None:
                        inspector.inspect(chunk)
                    yield chunk
            finally:
                watcher.cancel()
                await upstream.aclose()
                if inspector is not None:
                    inspector.finish(result, service_type, purpose)

        return StreamingResponse(relay(), status_code=upstream.status_code, media_type="text/event-stream")

    return app
