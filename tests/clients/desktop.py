"""Firefox desktop's Smart Window client: the real OpenAI JS SDK (pinned in
`tests/clients/desktop/package.json`), driven by node the way Firefox drives it.

What the desktop sends (mozilla-firefox/firefox `browser/components/aiwindow/models/
openAIEngine.sys.mjs`, `toolkit/components/ml/content/backends/OpenAIPipeline.mjs`; the
pipeline's source was not in the searchable index, so its details come from
shared/notes/firefox-clients.md): `new OpenAI({apiKey: <FxA token>, baseURL: <endpoint>/v1,
defaultHeaders})` with defaultHeaders user-agent, service-type, purpose, x-engine-id,
chat-id (plus an extraHeaders pref), then `chat.completions.create({...inferenceParams,
model, messages, stream, tools})`; a streamed call adds `stream_options: {include_usage:
true}`. Builds differ on `tools`: always sent (`[]` when none) or only when set. A 401
makes the engine drop its token, fetch a fresh one and retry once; the SDK itself retries
408/409/429/5xx up to twice.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import aiohttp

DESKTOP_DIR = Path(__file__).resolve().parent / "desktop"
WORKER = DESKTOP_DIR / "sdk_worker.mjs"
USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64; rv:150.0) Gecko/20100101 Firefox/150.0"
MODEL = "gemini-3.1-flash-lite"
SERVICE_TYPE = "ai"


def missing_reason() -> str | None:
    """Why the desktop emulation cannot run here, or None."""
    if shutil.which("node") is None:
        return "node not found: the desktop client emulation needs node (.ci/run installs it)"
    if not (DESKTOP_DIR / "node_modules" / "openai" / "package.json").is_file():
        return "the OpenAI JS SDK is not installed: run `npm ci` in tests/clients/desktop (.ci/run does)"
    return None


class SdkWorker:
    """One node process running the SDK; one JSON request in, one JSON result out."""

    def __init__(self, log_path: Path) -> None:
        self._log = open(log_path, "w")
        self._process = subprocess.Popen(
            ["node", str(WORKER)],
            cwd=DESKTOP_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._lock = threading.Lock()

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        with self._lock:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the SDK worker exited ({self._process.poll()}); see {self._log.name}")
        return json.loads(line)

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        # In a thread: the service under test answers on this test's event loop.
        return await asyncio.to_thread(self._call, request)

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


def default_headers(service_type: str = SERVICE_TYPE, purpose: str = "chat", chat_id: str = "chat-1") -> dict[str, str]:
    return {
        "user-agent": USER_AGENT,
        "service-type": service_type,
        "purpose": purpose,
        "x-engine-id": f"smart-openai-{purpose}-{MODEL}",
        "chat-id": chat_id,
    }


def chat_request(
    base_url: str, token: str, text: str, *, tools_always: bool = True, stream: bool = True, **headers: str
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "temperature": 0.7,
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are Firefox's assistant."}, {"role": "user", "content": text}],
        "stream": stream,
    }
    if tools_always:
        body["tools"] = []
    if stream:
        body["stream_options"] = {"include_usage": True}
    return {"baseURL": f"{base_url}/v1", "apiKey": token, "defaultHeaders": default_headers(**headers), "body": body}


def streamed_text(result: dict[str, Any]) -> str:
    """The text the chat view assembles from the chunks the SDK yielded."""
    return "".join(
        choice.get("delta", {}).get("content") or "" for chunk in result["chunks"] for choice in chunk.get("choices", [])
    )


def is_401(result: dict[str, Any]) -> bool:
    error = result.get("error")
    return bool(error) and (error["status"] == 401 or "401 status code" in error["message"])


async def hold_stream(session: aiohttp.ClientSession, base_url: str, token: str, text: str) -> None:
    """The desktop client's request for `text`, sent with aiohttp (not the SDK) and read to
    its end: a stream another request can be made beside."""
    request = chat_request(base_url, token, text)
    async with session.post(
        f"{base_url}/v1/chat/completions",
        data=json.dumps(request["body"]),
        headers={**request["defaultHeaders"], "authorization": f"Bearer {token}"},
    ) as response:
        await response.read()
