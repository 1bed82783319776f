"""The Privacy Filter service (compatibility.md §1.11), on the service's one shared ClientSession.

Its wire: `POST {PRIVACY_FILTER_API_BASE}/privacy-filter` with `x-pf-api-key` and a JSON
body `{"items": [...]}`, answered with `{"results", "model_id", "num_items", ...}`; and
`GET {PRIVACY_FILTER_API_BASE}/readyz` (no key) answered with `{"ready", "version",
"model_id"}`. No `aiohttp.web` here.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import hdrs

from ..settings import PrivacyFilterSettings

API_KEY_HEADER = "x-pf-api-key"
# Our upstream reads of the filter's answers: masked text of a batch, not a stream.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class PrivacyFilterFailed(Exception):
    """The Privacy Filter did not answer a 2xx JSON object: its status, a transport error, a
    timeout or an unreadable body. The text names which, never the items or the key."""


class PrivacyFilterClient:
    def __init__(self, session: aiohttp.ClientSession, settings: PrivacyFilterSettings) -> None:
        self._session = session
        self._filter_url = settings.url("/privacy-filter")
        self._readyz_url = settings.url("/readyz")
        self._headers = {hdrs.CONTENT_TYPE: "application/json", API_KEY_HEADER: settings.master_key}
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout_seconds)

    async def filter(self, body: bytes) -> dict[str, Any]:
        """The filter's JSON object for the encoded `{"items": [...]}` body."""
        try:
            async with self._session.post(
                self._filter_url, data=body, headers=self._headers, timeout=self._timeout
            ) as response:
                if not 200 <= response.status < 300:
                    raise PrivacyFilterFailed(f"Privacy Filter answered HTTP {response.status}")
                raw = await _read_bounded(response)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise PrivacyFilterFailed(f"Privacy Filter unreachable: {type(exc).__name__}") from None
        try:
            payload = json.loads(raw)
        except ValueError:
            raise PrivacyFilterFailed("Privacy Filter answer is not JSON") from None
        if not isinstance(payload, dict):
            raise PrivacyFilterFailed("Privacy Filter answer is not a JSON object")
        return payload

    async def readiness(self, timeout: float) -> tuple[int, Any]:
        """`/readyz`'s status and parsed JSON (None when the body is not JSON)."""
        async with self._session.get(self._readyz_url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            text = await response.text(errors="replace")
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, None


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    received = bytearray()
    async for chunk in response.content.iter_any():
        received += chunk
        if len(received) > MAX_RESPONSE_BYTES:
            raise PrivacyFilterFailed("Privacy Filter answer too large")
    return bytes(received)
