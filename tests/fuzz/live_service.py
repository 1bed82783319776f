"""The whole service with its loopback fakes, served from a thread of its own.

Schemathesis and hypothesis drive their examples synchronously; the service runs on its
own event loop in a background thread (memory store, fake LiteLLM, FxA and Google), so a
blocking client in the test thread never stalls it. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.auth.access_token import issue_access_token
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from mlpa_aiohttp.testing.fake_privacy_filter import FakePrivacyFilter
from tests.support.fake_google import FakeGoogle

from ..conftest import DEV_TOKEN, TEST_SECRETS, make_settings


class ErrorRecorder(logging.Handler):
    """Every ERROR (or worse) record and every record with a traceback, from any logger."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


@dataclass
class LiveService:
    base_url: str
    host: str
    port: int
    fxa: FakeFxA
    litellm: FakeLiteLLM
    app: web.Application
    access_token_secret: str
    errors: ErrorRecorder = field(default_factory=ErrorRecorder)

    def fxa_token(self, uid: str = "fuzz-uid") -> str:
        return self.fxa.issue_jwt(uid)

    def play_token(self, user_id: str = "fuzz-android") -> str:
        return issue_access_token(self.access_token_secret, user_id, 3600, time.time())

    def valid_headers(self) -> dict[str, str]:
        """Credentials every documented operation accepts (only the ones it reads matter)."""
        return {
            "authorization": f"Bearer {self.fxa_token()}",
            "x-dev-authorization": DEV_TOKEN,
            "master_key": f"Bearer {TEST_SECRETS['MASTER_KEY']}",
            "mlpa_ui_access_key": f"Bearer {TEST_SECRETS['MLPA_UI_ACCESS_KEY']}",
        }

    def raw_request(self, request: bytes, timeout: float = 10.0, *, end_input: bool = False) -> bytes:
        """Send bytes exactly as given on a fresh connection; the whole answer. With
        `end_input`, the sending side is shut after the bytes (the server reads EOF)."""
        with socket.create_connection((self.host, self.port), timeout=timeout) as sock:
            sock.sendall(request)
            if end_input:
                sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


@contextlib.contextmanager
def live_service(tmp_dir: Path, **env: str) -> Iterator[LiveService]:
    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    stop = asyncio.Event()
    ready = threading.Event()

    async def serve() -> None:
        litellm = FakeLiteLLM(virtual_key=TEST_SECRETS["MLPA_VIRTUAL_KEY"], master_key=TEST_SECRETS["MASTER_KEY"])
        fxa = FakeFxA()
        google = FakeGoogle()
        privacy_filter = FakePrivacyFilter()
        async with contextlib.AsyncExitStack() as stack:
            urls = []
            for fake_app in (litellm.make_app(), fxa.make_app(), privacy_filter.make_app()):
                runner = web.AppRunner(fake_app)
                await runner.setup()
                stack.push_async_callback(runner.cleanup)
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
            google_url = await stack.enter_async_context(google.serve())
            credentials = google.write_service_account_file(tmp_dir / "sa.json")
            settings = make_settings(
                urls[0],
                urls[1] + "/v1",
                PLAY_INTEGRITY_API_BASE=google_url,
                PLAY_INTEGRITY_CREDENTIALS_FILE=str(credentials),
                MLPA_MOCK_ROUTES="true",
                MOCK_TTFT_MS="0",
                MOCK_STREAMING_CHUNK_LATENCY_MS="0",
                # On, so that its operation is fuzzed past the disabled 503 (a 5xx by design).
                PRIVACY_FILTER_ENABLED="true",
                PRIVACY_FILTER_API_BASE=urls[2],
                PRIVACY_FILTER_MASTER_KEY=privacy_filter.api_key,
                **env,
            )
            app = create_app(settings)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            started["service"] = LiveService(
                base_url=f"http://127.0.0.1:{port}",
                host="127.0.0.1",
                port=port,
                fxa=fxa,
                litellm=litellm,
                app=app,
                access_token_secret=settings.auth.access_token_secret,
            )
            ready.set()
            await stop.wait()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve())
        except BaseException as exc:  # surfaced to the test thread below
            started["error"] = exc
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="live-service", daemon=True)
    thread.start()
    ready.wait(60)
    if "error" in started:
        raise RuntimeError("the live service did not start") from started["error"]
    service: LiveService = started["service"]
    root = logging.getLogger()
    root.addHandler(service.errors)
    try:
        yield service
    finally:
        root.removeHandler(service.errors)
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
