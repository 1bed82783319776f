"""The worker's one Redis client, every call bounded, and the link's health kept as episodes.

A sick Redis must cost a request at most `REDIS_TIMEOUT_MS`, and usually nothing: after a
failure the link is "backing off" for `REDIS_RETRY_SECONDS`, during which calls fail at once
without touching the network; the first call after that is the one probe (the next back-off
starts as it begins, so concurrent requests do not all wait on a dead server). An episode
(first failure to first success) is logged twice, at its start and its end, not per request;
every failure is counted by kind.

Nothing is contacted until the first call: a service whose features need no Redis never
connects (the reference's rule).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as redis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..observability.metrics import Metrics
from ..settings import RedisSettings

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Failure kinds, the `kind` label of mlpa_redis_failures_total.
TIMEOUT = "timeout"  # no answer within REDIS_TIMEOUT_MS (a stopped or overloaded server)
CONNECTION = "connection"  # refused, reset, closed (a server down or restarting)
ERROR = "error"  # the server answered with an error (read-only replica, OOM, script error)
BACKING_OFF = "backing_off"  # not tried: within REDIS_RETRY_SECONDS of the last failure
FAILURE_KINDS = (TIMEOUT, CONNECTION, ERROR, BACKING_OFF)


class RedisUnavailable(Exception):
    """A Redis call that did not succeed within the bound; `kind` is one of FAILURE_KINDS."""

    def __init__(self, kind: str, operation: str) -> None:
        super().__init__(f"redis {operation}: {kind}")
        self.kind = kind
        self.operation = operation


def _kind_of(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, RedisTimeoutError)):
        return TIMEOUT
    if isinstance(exc, (RedisConnectionError, OSError)):
        return CONNECTION
    return ERROR


class RedisLink:
    """`run(operation, call)` runs `call(client)` within the bound, or raises RedisUnavailable."""

    def __init__(
        self, settings: RedisSettings, metrics: Metrics, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bound_seconds = settings.timeout_ms / 1000
        self.retry_seconds = settings.retry_seconds
        self._metrics = metrics
        self._clock = clock
        self.client = redis.Redis(
            host=settings.host,
            port=settings.port,
            password=settings.password or None,
            socket_timeout=self.bound_seconds,
            socket_connect_timeout=self.bound_seconds,
            # One attempt: the fallback, not a retry loop, is the answer to a failed call.
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._sick_since: float | None = None
        self._next_try = 0.0
        self._episode_failures = 0
        metrics.redis_up.set(1)

    @property
    def healthy(self) -> bool:
        """False from a failure until the next success."""
        return self._sick_since is None

    async def run(self, operation: str, call: Callable[[redis.Redis], Awaitable[T]]) -> T:
        if self._sick_since is not None:
            now = self._clock()
            if now < self._next_try:
                self._count(operation, BACKING_OFF)
                raise RedisUnavailable(BACKING_OFF, operation)
            self._next_try = now + self.retry_seconds  # this call is the episode's probe
        try:
            async with asyncio.timeout(self.bound_seconds):
                result = await call(self.client)
        except (RedisError, OSError, TimeoutError) as exc:
            kind = _kind_of(exc)
            self._failed(operation, kind, exc)
            raise RedisUnavailable(kind, operation) from exc
        if self._sick_since is not None:
            self._recovered(operation)
        return result

    def _count(self, operation: str, kind: str) -> None:
        self._episode_failures += 1
        self._metrics.redis_failures.labels(operation, kind).inc()

    def _failed(self, operation: str, kind: str, exc: BaseException) -> None:
        self._count(operation, kind)
        if self._sick_since is None:
            self._sick_since = self._clock()
            self._next_try = self._sick_since + self.retry_seconds
            self._metrics.redis_up.set(0)
            # The episode's one WARNING; the error's class only (its text may carry the address).
            log.warning(
                "redis_unavailable",
                operation=operation,
                kind=kind,
                error=type(exc).__name__,
                fallback_for_seconds=self.retry_seconds,
            )

    def _recovered(self, operation: str) -> None:
        assert self._sick_since is not None
        log.info(
            "redis_recovered",
            operation=operation,
            down_seconds=round(self._clock() - self._sick_since, 3),
            failures=self._episode_failures,
        )
        self._sick_since = None
        self._episode_failures = 0
        self._metrics.redis_up.set(1)

    async def close(self) -> None:
        await self.client.aclose()
