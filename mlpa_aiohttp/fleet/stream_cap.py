"""MAX_CONCURRENT_STREAMS_PER_USER counted across the fleet (`STREAM_CAP_SCOPE=fleet`).

Every open stream holds a lease in Redis: a sorted set per identity (`uid:service_type`) whose
members are lease ids and whose scores are expiry times on Redis's own clock (`TIME` inside
the scripts), so no pod's clock matters. Taking a lease is one round trip (`ACQUIRE`: trim the
expired, count, add if below the cap). A worker's live leases are renewed by one app-wide task
in one call per `lease/3` (`RENEW`), which also re-adds leases Redis lost (a restart); a worker
that dies without releasing stops renewing, and its leases expire within one lifetime.
Releases are queued and sent by the same task in one pipeline, so a release is never
overtaken by a renewal that would re-add it; a worker's next acquire for the same identity
also carries its unsent releases (a user's next stream on this worker never meets its own
finished one).

The per-worker cap (`stream_slots.StreamSlots`) is always counted too: it is the floor (a
worker never admits more than the cap for one identity) and the whole answer while Redis is
unavailable, slow or just restarted (`fallback`). docs/scaling.md states what a user can exceed
in each failure, and for how long.

Nothing here runs per event: an acquire at a stream's start, a queued release at its end.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Callable

import redis.asyncio as redis
import structlog

from ..observability.metrics import Metrics
from ..stream_slots import StreamSlots
from .redis_link import RedisLink, RedisUnavailable

log = structlog.get_logger(__name__)

LEASE_KEY_PREFIX = "mlpa:stream_leases:"
# The `operation` labels of mlpa_redis_failures_total.
ACQUIRE = "stream_lease_acquire"
RENEW = "stream_lease_renew"
RELEASE = "stream_lease_release"
# The `scope` labels of mlpa_stream_cap_scope.
FLEET = "fleet"
WORKER = "worker"

# Milliseconds on Redis's clock; Lua 5.1 numbers are doubles, exact far beyond this range.
_NOW_MS = (
    "local clock = redis.call('TIME')\n"
    "local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)\n"
)

ACQUIRE_SCRIPT = (
    "-- KEYS[1]: one identity's leases. ARGV: lease id, cap, lifetime ms, then leases of this\n"
    "-- identity its worker released and has not yet told (removed first).\n"
    + _NOW_MS
    + """for i = 4, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

RENEW_SCRIPT = (
    "-- KEYS: identities' leases. ARGV: lifetime ms, then per key its lease count and ids.\n"
    "-- Returns how many leases were missing (re-added): a restart, or a renewal too late.\n"
    + _NOW_MS
    + """local expiry = now + tonumber(ARGV[1])
local at, restored = 2, 0
for k = 1, #KEYS do
  local n = tonumber(ARGV[at])
  for i = at + 1, at + n do restored = restored + redis.call('ZADD', KEYS[k], expiry, ARGV[i]) end
  at = at + n + 1
  redis.call('PEXPIRE', KEYS[k], ARGV[1])
end
return restored
"""
)


def lease_key(identity: str) -> str:
    return LEASE_KEY_PREFIX + identity


class FleetStreamCap:
    """`take(identity)` → a lease id, or None (the cap is reached); `give_back` at the stream's end,
    however it ends. `run()` is the app-wide task: releases, renewals, re-registration."""

    def __init__(
        self,
        slots: StreamSlots,
        link: RedisLink,
        *,
        lease_seconds: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots = slots
        self.limit = slots.limit
        self.lease_seconds = lease_seconds
        self.renew_every = lease_seconds / 3
        self._lease_ms = int(lease_seconds * 1000)
        self._link = link
        self._metrics = metrics
        self._clock = clock
        self._acquire = link.client.register_script(ACQUIRE_SCRIPT)
        self._renew = link.client.register_script(RENEW_SCRIPT)
        # Unique across the fleet without coordination: a random tag per worker, a serial per lease.
        self._tag = secrets.token_hex(4)
        self._serial = itertools.count(1)
        self._live: dict[str, set[str]] = {}  # lease key -> this worker's live lease ids
        self._unsent: dict[str, dict[str, float]] = {}  # lease key -> {released lease id: when}
        self._wake = asyncio.Event()
        self._flush_at = 0.0
        self._renew_at = clock() + self.renew_every
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_for = 0.0
        # False from a Redis failure until a renewal has re-registered every live lease.
        self.in_force = True
        self._episode_fallbacks = 0
        self._losses = 0
        self._set_scope(FLEET)

    # ---- per stream ------------------------------------------------------------------------

    async def take(self, identity: str) -> str | None:
        if not self.slots.try_take(identity):
            return None  # the worker's own count is a floor of the fleet's: no round trip needed
        key = lease_key(identity)
        lease = f"{self._tag}:{next(self._serial)}"
        unsent = tuple(self._unsent.get(key, ()))
        try:
            admitted = await self._link.run(
                ACQUIRE,
                lambda client: self._acquire(
                    keys=(key,), args=(lease, self.limit, self._lease_ms, *unsent), client=client
                ),
            )
        except RedisUnavailable as unavailable:
            admitted = 1  # the per-worker slot taken above is the whole answer while Redis is sick
            self._fell_back(unavailable.kind)
        except BaseException:
            # Cancelled (the client left) perhaps after Redis ran the script: tell it released.
            self.slots.give_back(identity)
            self._release(key, lease)
            raise
        else:
            self._sent(key, unsent)
            if not self.in_force:
                self._renew_soon(0.0)  # Redis answers again: re-register now, not at the next renewal
        if not admitted:
            self.slots.give_back(identity)
            return None
        self._live.setdefault(key, set()).add(lease)
        return lease

    def give_back(self, identity: str, lease: str) -> None:
        """Synchronous (a `finally` of a cancelled handler must not wait): the release is queued."""
        self.slots.give_back(identity)
        key = lease_key(identity)
        held = self._live.get(key)
        if held is not None:
            held.discard(lease)
            if not held:
                del self._live[key]
        self._release(key, lease)

    def _release(self, key: str, lease: str) -> None:
        self._unsent.setdefault(key, {})[lease] = self._clock()
        self._wake.set()

    def _sent(self, key: str, leases: tuple[str, ...]) -> None:
        pending = self._unsent.get(key)
        if pending is None:
            return
        for lease in leases:
            pending.pop(lease, None)
        if not pending:
            del self._unsent[key]

    # ---- the app-wide task -----------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                now = self._clock()
                due = min(self._renew_at, self._flush_at) if self._unsent else self._renew_at
                if due > now:
                    # One timer for the next due time, kept while that time holds: a stream's
                    # release wakes this task through the event and arms nothing.
                    if self._alarm is None or self._alarm_for != due:
                        if self._alarm is not None:
                            self._alarm.cancel()
                        self._alarm, self._alarm_for = loop.call_later(due - now, self._ring), due
                    await self._wake.wait()
                    self._wake.clear()
                    continue
                await self._do_due(now)
        finally:
            if self._alarm is not None:
                self._alarm.cancel()
                self._alarm = None

    def _ring(self) -> None:
        self._alarm = None  # fired (perhaps a little early by our clock): the next wait arms anew
        self._wake.set()

    async def _do_due(self, now: float) -> None:
        if self._unsent and self._flush_at <= now:
            sent = await self.flush_releases()
            self._flush_at = self._clock() if sent else self._clock() + self._retry_seconds()
        if self._clock() >= self._renew_at:
            renewed = await self.renew() and self.in_force
            self._renew_at = self._clock() + (self.renew_every if renewed else self._retry_seconds())

    def _retry_seconds(self) -> float:
        return max(self._link.retry_seconds, 0.05)

    async def flush_releases(self) -> bool:
        """Tell Redis every queued release in one pipeline; False if Redis did not answer."""
        now = self._clock()
        batch: dict[str, tuple[str, ...]] = {}
        for key, pending in list(self._unsent.items()):
            # A release older than a lifetime has expired by itself (or was never registered).
            fresh = tuple(lease for lease, when in pending.items() if now - when < self.lease_seconds)
            if fresh:
                batch[key] = fresh
            else:
                del self._unsent[key]
        if not batch:
            return True

        async def remove(client: redis.Redis) -> object:
            if len(batch) == 1:  # the usual case outside bursts: one command, no pipeline to build
                [(key, leases)] = batch.items()
                return await client.zrem(key, *leases)
            pipe = client.pipeline(transaction=False)
            for key, leases in batch.items():
                pipe.zrem(key, *leases)
            return await pipe.execute()

        try:
            await self._link.run(RELEASE, remove)
        except RedisUnavailable:
            self._lost_redis()
            return False
        for key, leases in batch.items():
            self._sent(key, leases)
        return True

    async def renew(self) -> bool:
        """Extend (and re-add, if Redis lost them) every live lease of this worker in one call."""
        live = {key: tuple(leases) for key, leases in self._live.items() if leases}
        losses = self._losses
        try:
            if live:
                args: list[str | int] = [self._lease_ms]
                for leases in live.values():
                    args.append(len(leases))
                    args.extend(leases)
                restored = int(
                    await self._link.run(RENEW, lambda client: self._renew(keys=tuple(live), args=args, client=client))
                )
            elif not self.in_force:
                # Nothing to re-register: one probe says whether the fleet count is back.
                await self._link.run(RENEW, lambda client: client.ping())
                restored = 0
            else:
                return True
        except RedisUnavailable:
            self._lost_redis()
            return False
        if restored:
            self._metrics.stream_leases_restored.inc(restored)
        if not self.in_force and losses == self._losses:
            log.info(
                "stream_cap_back_in_force",
                scope=FLEET,
                leases_reregistered=sum(len(leases) for leases in live.values()),
                leases_restored=restored,
                fallbacks=self._episode_fallbacks,
            )
            self.in_force = True
            self._episode_fallbacks = 0
            self._set_scope(FLEET)
        elif restored and self.in_force:
            # Leases gone with no failure seen here: Redis restarted between two calls, or a
            # renewal came later than a lifetime.
            log.warning("stream_leases_restored", leases_restored=restored)
        return True

    # ---- state -----------------------------------------------------------------------------

    def _fell_back(self, kind: str) -> None:
        self._metrics.stream_cap_fallbacks.labels(kind).inc()
        self._episode_fallbacks += 1
        self._lost_redis()

    def _lost_redis(self) -> None:
        self._losses += 1  # a renewal in flight meanwhile may have missed a lease admitted now
        if self.in_force:
            self.in_force = False
            self._set_scope(WORKER)
            # Re-register as soon as the link may try again: Redis may come back empty.
            self._renew_soon(self._retry_seconds())

    def _renew_soon(self, delay: float) -> None:
        self._renew_at = min(self._renew_at, self._clock() + delay)
        self._wake.set()

    def _set_scope(self, scope: str) -> None:
        self._metrics.stream_cap_scope.labels(FLEET).set(scope == FLEET)
        self._metrics.stream_cap_scope.labels(WORKER).set(scope == WORKER)

    @property
    def leases_held(self) -> int:
        return sum(len(leases) for leases in self._live.values())

    async def close(self) -> None:
        """At shutdown, after the drain: the last releases, one attempt within the bound."""
        if self._unsent:
            await self.flush_releases()
