"""A fake Privacy Filter service speaking its wire over loopback (tests and the demo).

* `POST /privacy-filter` with `x-pf-api-key: <api_key>` and `{"items": [<string>, ...]}` →
  200 `{"results": [{"masked_text", "spans": [{"category", "text", "start", "end",
  "score"}]}], "model_id", "num_items"}`: e-mail addresses are masked as `[EMAIL]`. A wrong
  or missing key → 401 `{"detail": "Invalid API key"}`; a body without a list of strings →
  422.
* `GET /readyz` (no key) → 200 `{"ready": true, "version", "model_id"}`.

Knobs a test sets on the instance: `filter_status` / `filter_body` (a canned answer instead
of the masking), `filter_delay` (seconds before answering), `ready`, `readyz_status`,
`readyz_body` and `readyz_delay`. Every request is recorded in `requests`.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["FILTER_PATH", "READYZ_PATH", "FakePrivacyFilter", "RecordedFilterRequest"]

FILTER_PATH = "/privacy-filter"
READYZ_PATH = "/readyz"
API_KEY_HEADER = "x-pf-api-key"
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


@dataclass(frozen=True, slots=True)
class RecordedFilterRequest:
    """One request the fake received; `headers` keys are lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class FakePrivacyFilter:
    def __init__(self, *, api_key: str = "sk-fake-privacy-filter", model_id: str = "pii-filter", version: str = "0.3.1") -> None:
        self.api_key = api_key
        self.model_id = model_id
        self.version = version
        self.requests: list[RecordedFilterRequest] = []
        self.filter_status = 200
        # When set, answered as JSON (or as text when a str) instead of the masking result.
        self.filter_body: Any = None
        self.filter_delay = 0.0
        self.ready = True
        self.readyz_status = 200
        self.readyz_body: Any = None
        self.readyz_delay = 0.0

    def make_app(self) -> web.Application:
        app = web.Application(handler_args={"handler_cancellation": True})
        app.router.add_post(FILTER_PATH, self._handle_filter)
        app.router.add_get(READYZ_PATH, self._handle_readyz)
        return app

    def requests_to(self, path: str) -> list[RecordedFilterRequest]:
        return [record for record in self.requests if record.path == path]

    def mask(self, items: list[str]) -> dict[str, Any]:
        """The answer the fake gives for `items`."""
        results = []
        for item in items:
            spans = [
                {"category": "email", "text": match.group(), "start": match.start(), "end": match.end(), "score": 0.99}
                for match in _EMAIL.finditer(item)
            ]
            results.append({"masked_text": _EMAIL.sub("[EMAIL]", item), "spans": spans})
        return {"results": results, "model_id": self.model_id, "num_items": len(items)}

    async def _record(self, request: web.Request) -> bytes:
        body = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.requests.append(RecordedFilterRequest(request.method, request.path, headers, body))
        return body

    async def _handle_filter(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if self.filter_delay:
            await asyncio.sleep(self.filter_delay)
        if request.headers.get(API_KEY_HEADER) != self.api_key:
            return web.json_response({"detail": "Invalid API key"}, status=401)
        if self.filter_body is not None or self.filter_status != 200:
            if isinstance(self.filter_body, str):
                return web.Response(status=self.filter_status, text=self.filter_body)
            return web.json_response(self.filter_body, status=self.filter_status)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        items = payload.get("items") if isinstance(payload, dict) else None
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            return web.json_response({"detail": "items must be a list of strings"}, status=422)
        return web.json_response(self.mask(items))

    async def _handle_readyz(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.readyz_delay:
            await asyncio.sleep(self.readyz_delay)
        if self.readyz_body is not None:
            if isinstance(self.readyz_body, str):
                return web.Response(status=self.readyz_status, text=self.readyz_body)
            return web.json_response(self.readyz_body, status=self.readyz_status)
        body = {"ready": self.ready, "version": self.version, "model_id": self.model_id}
        return web.json_response(body, status=self.readyz_status)
