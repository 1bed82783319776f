"""LiteLLM over one shared aiohttp ClientSession: completions, search, admin calls.

The session is created by `open_session()` (used as the app's cleanup context) and is the
service's one outbound aiohttp pool: FxA and Play Integrity calls use it too. No
`aiohttp.web` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
import structlog
from aiohttp import hdrs

from ..observability.metrics import Metrics
from ..observability.upstream_text import upstream_text_for_log
from ..settings import UpstreamSettings
from .bodies import UpstreamBody
from .classify import error_detail
from .connector import make_connector, watching_connection

log = structlog.get_logger(__name__)

def open_session(settings: UpstreamSettings) -> aiohttp.ClientSession:
    """The shared session: high connector limit (the default 100 silently queues the
    101st stream), and no cookie jar: it serves every user, so a cookie an upstream sets
    during one user's request must never ride along on another's.

    Every call passes its own `ClientTimeout` (LiteLLMClient's per-kind timeouts, FxA's,
    Google's), which replaces this default whole; the default (connect and read bounded, no
    total, which would cut long streams) only bounds a call added without one."""
    connector = make_connector(
        limit=settings.max_connections,
        limit_per_host=0,
        keepalive_timeout=settings.keepalive_timeout_seconds,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout_seconds,
            sock_read=settings.streaming_timeout_seconds,
        ),
        read_bufsize=UPSTREAM_READ_BUFFER_BYTES,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


# The upstream response reader pauses reading LiteLLM's socket above twice this. A client
# that stops reading stalls its relay, and everything up to that mark waits in this process:
# with aiohttp's 64 KiB default a stalled stream held ~2 MiB of RSS, with 16 KiB ~0.6 MiB
# (tests/load/test_slow_readers.py). SSE events are far smaller, so a flowing stream never
# reaches the mark; only backpressure does.
UPSTREAM_READ_BUFFER_BYTES = 16 * 1024

# Error bodies are read whole for classification; a misbehaving upstream must not make
# us buffer megabytes.
MAX_ERROR_BODY_BYTES = 64 * 1024


async def read_error_body(response: aiohttp.ClientResponse) -> str:
    chunks, size = [], 0
    async for chunk in response.content.iter_any():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BODY_BYTES:
            break
    return b"".join(chunks)[:MAX_ERROR_BODY_BYTES].decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """A fully read (small) upstream response."""

    status: int
    text: str
    headers: Mapping[str, str]


# LiteLLM answers these when it (or its provider) is briefly unavailable; a 4xx is about
# the request itself and is never retried.
RETRIED_STATUSES = frozenset({502, 503})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """UPSTREAM_RETRY_*: at most `attempts` more tries after the first, each after an
    exponential backoff with jitter, and none that would start after `budget_seconds`."""

    attempts: int
    backoff_seconds: float
    budget_seconds: float

    def delay(self, retry: int) -> float:
        """Seconds before retry number `retry` (1-based): base * 2^(n-1), jittered to
        between half and all of it so that clients failed together do not return together."""
        return self.backoff_seconds * (2 ** (retry - 1)) * random.uniform(0.5, 1.0)


class _Retryable(Exception):
    """An attempt that failed transiently before any response byte, or answered 502/503."""

    def __init__(self, reason: str, response: aiohttp.ClientResponse | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.response = response


class LiteLLMClient:
    def __init__(
        self, session: aiohttp.ClientSession, settings: UpstreamSettings, metrics: Metrics | None = None
    ) -> None:
        self._session = session
        self._metrics = metrics
        self._retry = (
            RetryPolicy(settings.retry_attempts, settings.retry_backoff_seconds, settings.retry_budget_seconds)
            if settings.retry_attempts > 0
            else None
        )
        self._known_version: str | None = None
        self._completions_url = settings.url("/v1/chat/completions")
        self._search_url = settings.url("/v1/search/exa-search")
        self._customer_new_url = settings.url("/customer/new")
        self._customer_info_url = settings.url("/customer/info")
        self._readiness_url = settings.url("/health/readiness")
        self._model_hub_url = settings.url("/public/model_hub/info")
        self._virtual_headers: Mapping[str, str] = {
            hdrs.AUTHORIZATION: f"Bearer {settings.virtual_key}",
            hdrs.CONTENT_TYPE: "application/json",
        }
        self._master_headers = {
            hdrs.AUTHORIZATION: f"Bearer {settings.master_key}",
            hdrs.CONTENT_TYPE: "application/json",
        }
        # No sock_read on streams: it would re-arm a timer per upstream read. Silence
        # before the headers is bounded below; after them, by the stream tracker's watch.
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.connect_timeout_seconds, sock_read=None
        )
        self._stream_headers_deadline = settings.streaming_timeout_seconds
        self._read_timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout_seconds,
            sock_read=settings.read_timeout_seconds,
        )
        self._admin_timeout = aiohttp.ClientTimeout(
            total=settings.admin_timeout_seconds, sock_connect=settings.connect_timeout_seconds
        )
        self._search_timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout_seconds,
            sock_read=settings.search_timeout_seconds,
        )

    def _key_headers(self, virtual_key: str | None) -> Mapping[str, str]:
        """The headers of a completion or search: the client's own key (`litellm-virtual-key`,
        already allowed and trimmed by the route) or the service's."""
        if virtual_key is None:
            return self._virtual_headers
        return {hdrs.AUTHORIZATION: f"Bearer {virtual_key}", hdrs.CONTENT_TYPE: "application/json"}

    @contextlib.asynccontextmanager
    async def completion(
        self, body: UpstreamBody, *, stream: bool, virtual_key: str | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST a completion; yields the response once its headers arrived. The body is
        taken from its holder: the conversation is not kept while the answer streams.
        `virtual_key`: the client's own LiteLLM key instead of MLPA_VIRTUAL_KEY.

        Leaving the block releases the response, which closes a half-read upstream
        connection instead of returning it to the pool.
        """
        headers = self._key_headers(virtual_key)
        # No local name for the body: this frame lives as long as the stream.
        if self._retry is None:
            response = await self._post_completion(body.take(), stream, headers)
        else:
            response = await self._post_completion_with_retries(body.take(), stream, headers, self._retry)
        try:
            yield response
        finally:
            response.release()

    async def _post_completion(
        self, payload: bytes, stream: bool, headers: Mapping[str, str], resends: list[str] | None = None
    ) -> aiohttp.ClientResponse:
        url = self._completions_url
        if stream:
            async with asyncio.timeout(self._stream_headers_deadline):
                return await self._post_with_stale_retry(url, payload, self._stream_timeout, headers, resends)
        return await self._post_with_stale_retry(url, payload, self._read_timeout, headers, resends)

    async def _attempt(
        self, payload: bytes, stream: bool, headers: Mapping[str, str], resends: list[str]
    ) -> aiohttp.ClientResponse:
        """One try (with its stale-connection re-send); transient failures become `_Retryable`.
        Only failures before any response byte qualify: once headers are in, the caller
        owns the response, and nothing here runs after a byte reached the client."""
        try:
            response = await self._post_completion(payload, stream, headers, resends)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc, aiohttp.ClientConnectorCertificateError):
                raise
            raise _Retryable("connect_error") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise _Retryable("connection_reset") from exc
        if response.status in RETRIED_STATUSES:
            raise _Retryable(f"status_{response.status}", response)
        return response

    async def _post_completion_with_retries(
        self, payload: bytes, stream: bool, headers: Mapping[str, str], policy: RetryPolicy
    ) -> aiohttp.ClientResponse:
        """`_attempt` until it answers, the attempts are spent, or the next backoff would end
        past the budget; then the last failure is the answer (its response or its error).
        A client's hang-up cancels the handler at the backoff sleep: nothing is left running.
        One log line per request that was retried or re-sent, one metric sample per re-send.

        The stale keep-alive re-send (`_post_with_stale_retry`) stays inside an attempt and
        spends none of the attempts or budget: LiteLLM never saw that request. It is named
        in `reasons`, so this one line tells the request's whole story."""
        started = time.monotonic()
        reasons: list[str] = []
        retries = 0
        while True:
            try:
                response = await self._attempt(payload, stream, headers, reasons)
            except _Retryable as failure:
                retry = retries + 1
                delay = policy.delay(retry)
                if retry > policy.attempts or time.monotonic() - started + delay > policy.budget_seconds:
                    if reasons:
                        log.info("upstream_retries_exhausted", retries=retries, reasons=reasons, last=failure.reason)
                    if failure.response is not None:
                        return failure.response
                    assert failure.__cause__ is not None
                    raise failure.__cause__ from None
                if failure.response is not None:
                    failure.response.release()
                retries = retry
                reasons.append(failure.reason)
                self._count_resend(failure.reason)
                await asyncio.sleep(delay)
                continue
            if reasons:
                log.info("upstream_retried", retries=retries, reasons=reasons)
            return response

    async def search(self, body: bytes, *, virtual_key: str | None = None) -> UpstreamReply:
        headers = self._key_headers(virtual_key)
        response = await self._post_with_stale_retry(self._search_url, body, self._search_timeout, headers)
        async with response:
            return UpstreamReply(response.status, await response.text(), dict(response.headers))

    def _count_resend(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.upstream_retries.labels(reason).inc()

    async def _post_with_stale_retry(
        self,
        url: str,
        body: bytes,
        timeout: aiohttp.ClientTimeout,
        headers: Mapping[str, str],
        resends: list[str] | None = None,
    ) -> aiohttp.ClientResponse:
        """POST once, and once more only if a *reused* pooled connection turned out to be
        closed by the server before any response (compatibility.md D3). POST is not idempotent, so
        aiohttp never retries it itself; in this window the upstream never saw a request.
        With `resends` (the retrying caller's list) the re-send is noted there instead of
        logged, so that caller logs one line for the request."""
        with watching_connection() as connection:
            try:
                return await self._session.post(url, data=body, headers=headers, timeout=timeout)
            except aiohttp.ClientConnectorError:
                raise
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if not connection.reused:
                    raise
                error = type(exc).__name__
        self._count_resend("stale_connection")
        if resends is None:
            log.info("upstream_stale_connection_retry", error=error)
        else:
            resends.append("stale_connection")
        return await self._session.post(url, data=body, headers=headers, timeout=timeout)

    # -- admin calls (master key) ----------------------------------------------------
    async def create_customer(self, user_id: str, budget_id: str) -> None:
        """`POST /customer/new`. The status is deliberately not checked (compatibility.md §3.1): a
        concurrent creator's duplicate error is harmless because the caller re-reads."""
        async with self._session.post(
            self._customer_new_url,
            json={"user_id": user_id, "budget_id": budget_id},
            headers=self._master_headers,
            timeout=self._admin_timeout,
        ) as response:
            text = await response.text(errors="replace")
            if response.status >= 400:
                # A duplicate (400, a concurrent creator) is expected; anything else is
                # LiteLLM refusing the user, e.g. its foreign key on a missing budget row.
                level = log.info if response.status == 400 else log.warning
                level(
                    "litellm_customer_new_status",
                    status=response.status,
                    upstream_detail=upstream_text_for_log(error_detail(text)),
                )

    async def customer_info(self, user_id: str) -> UpstreamReply:
        async with self._session.get(
            self._customer_info_url,
            params={"end_user_id": user_id},
            headers=self._master_headers,
            timeout=self._admin_timeout,
        ) as response:
            return UpstreamReply(response.status, await response.text(), dict(response.headers))

    async def readiness(self, timeout: float) -> UpstreamReply:
        async with self._session.get(
            self._readiness_url, headers=self._master_headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            return UpstreamReply(response.status, await response.text(), dict(response.headers))

    async def version(self, timeout: float) -> str | None:
        """LiteLLM's version; remembered once known (it changes only with a deploy of
        LiteLLM, and readiness probes ask every few seconds)."""
        if self._known_version is not None:
            return self._known_version
        async with self._session.get(self._model_hub_url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                return None
            payload = await response.json(content_type=None)
        version = None
        if isinstance(payload, dict):
            # compatibility.md §1.2: newer LiteLLMs name it `version`.
            version = payload.get("litellm_version") or payload.get("version")
        if isinstance(version, str) and version and version != "N/A":
            self._known_version = version
        return self._known_version
