"""Is LiteLLM there when the service starts? One WARNING if not, naming the URL and why.

The service starts either way: LiteLLM may come up after it, readiness reports
`unreachable` meanwhile, and completions fail until it answers. Without this line the only
sign at start-up would be readiness. The check is one TCP connection to LiteLLM's host and
port, made in the background so start-up never waits for it, and sends no request (LiteLLM
logs nothing, a fake records nothing). `app_factory` runs it in a cleanup context (serve,
gunicorn); each process that starts the app checks once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import structlog
from yarl import URL

from ..settings import UpstreamSettings

log = structlog.get_logger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}


def connection_failure_cause(error: BaseException, timeout_seconds: float) -> str:
    """A few words for why a connection failed: "connection refused", "name not resolved
    (...)", "no answer within 10 s"."""
    if isinstance(error, socket.gaierror):
        return f"name not resolved ({error.strerror})"
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout_seconds:g} s"
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno).lower()
    return str(error) or type(error).__name__


def shown_url(api_base: str) -> str:
    """The base URL as logged: without any user or password it may carry."""
    return str(URL(api_base).with_user(None))


async def litellm_unreachable_cause(settings: UpstreamSettings) -> str | None:
    """None when a TCP connection to LiteLLM opens within the connect timeout, else why not."""
    url = URL(settings.api_base)
    host, port = url.host, url.port or _DEFAULT_PORTS.get(url.scheme or "", 80)
    if not host:
        return "the URL names no host"
    timeout = settings.connect_timeout_seconds
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as error:
        return connection_failure_cause(error, timeout)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def warn_if_litellm_unreachable(settings: UpstreamSettings) -> None:
    cause = await litellm_unreachable_cause(settings)
    if cause is not None:
        log.warning(
            "litellm_unreachable",
            url=shown_url(settings.api_base),
            cause=cause,
            consequence="starting anyway: readiness is 503 and completions fail until LiteLLM answers",
        )
