"""Stream helpers shared by the streaming tests."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import hdrs

from mlpa_aiohttp import keys


async def direct_stream_bytes(service: Any, body: dict) -> bytes:
    """What the fake LiteLLM sends for `body` when asked directly (not through the service)."""
    url = service.app[keys.SETTINGS].upstream.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url, json=body, headers={hdrs.AUTHORIZATION: f"Bearer {service.litellm.virtual_key}"}
        ) as response:
            return await response.read()
