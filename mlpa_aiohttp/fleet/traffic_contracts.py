"""Traffic contracts (docs/traffic-contracts.md; compatibility.md §1.8, D50-D53): fleet-wide request
(RPM) and token (TPM) counters per feature and for all features together (the basket), in
fixed windows in Redis, and each request classified against their limits.

Layout: one hash per dimension and window, `{prefix}:{rpm|tpm}:{window_start}`, one field
per feature name and `__basket__` (their sum), expiring `TRAFFIC_CONTRACT_COUNTER_TTL_SECONDS`
after its last count. A request costs one round trip, a script, before upstream (`admit`);
its count after it (`count_after`) is added up in the worker and written by the one flusher
task, every FLUSH_INTERVAL_SECONDS, one script per window and feature that has counts: the
response never waits, and a busy worker makes a few count round trips a second, not one per
request.

Two modes:
* observational (the reference's): the check only reads; an over-contract request is logged
  and labelled (`normal`, `borrowed`, `degraded`) and goes on. RPM counts include the proposed
  request, TPM counts are recorded usage.
* enforcing (`TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT`, beyond the reference): the same script
  also counts the request's RPM as it admits it, in the same atomic step, unless the basket
  is over (`degraded`): then the request is refused with 429, error 12. The count after upstream
  adds the tokens only; a stream without a usage chunk counts its content deltas, an estimate.

Redis failing costs a request at most REDIS_TIMEOUT_MS (fleet/redis_link.py): fail-open goes
on unchecked (modes `N/A`), fail-closed answers 503. Nothing here knows aiohttp.web.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from redis.exceptions import RedisError

from ..catalog import (
    TRAFFIC_FEATURE_S2S,
    TRAFFIC_FEATURE_S2S_ANDROID,
    TRAFFIC_FEATURE_SMART_WINDOW,
)
from ..errors import OverTrafficContract, TrafficContractUnavailable
from ..observability import log_context
from ..settings import TrafficContractSettings
from .redis_link import RedisLink, RedisUnavailable

log = structlog.get_logger(__name__)

# The request's modes (the `traffic_contract_*_mode` labels of mlpa_requests_total).
NORMAL = "normal"
BORROWED = "borrowed"  # over the feature's limit, within the basket's
DEGRADED = "degraded"  # over the basket's limit
NOT_APPLICABLE = "N/A"  # off, not reached, or failed open
MODES = (NORMAL, BORROWED, DEGRADED, NOT_APPLICABLE)
UNCHECKED = (NOT_APPLICABLE, NOT_APPLICABLE)

BASKET_FIELD = "__basket__"
# How long the flusher gathers counts before writing them: the counters lag the requests'
# ends by at most this (plus one Redis call).
FLUSH_INTERVAL_SECONDS = 0.05

# KEYS: the RPM and TPM keys of the current windows. ARGV: feature, RPM feature and basket
# limits, TPM feature and basket limits, reserve (1: count the request's RPM unless the
# basket is over; enforcing mode), TTL. Returns the four counts (RPM with the proposed
# request; -1 for a dimension without limits, which is not read) and whether it reserved.
CHECK_SCRIPT = """
local feature = ARGV[1]
local reserve = ARGV[6] == '1'
local function read(key, feature_limit, basket_limit, proposed)
  if feature_limit == 0 and basket_limit == 0 and not reserve then
    return -1, -1
  end
  local counts = redis.call('HMGET', key, feature, '__basket__')
  return (tonumber(counts[1]) or 0) + proposed, (tonumber(counts[2]) or 0) + proposed
end
local rpm_basket_limit = tonumber(ARGV[3])
local tpm_basket_limit = tonumber(ARGV[5])
local rpm_feature, rpm_basket = read(KEYS[1], tonumber(ARGV[2]), rpm_basket_limit, 1)
local tpm_feature, tpm_basket = read(KEYS[2], tonumber(ARGV[4]), tpm_basket_limit, 0)
local reserved = 0
if reserve
    and not (rpm_basket_limit > 0 and rpm_basket > rpm_basket_limit)
    and not (tpm_basket_limit > 0 and tpm_basket > tpm_basket_limit) then
  redis.call('HINCRBY', KEYS[1], feature, 1)
  redis.call('HINCRBY', KEYS[1], '__basket__', 1)
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[7]))
  reserved = 1
end
return {rpm_feature, rpm_basket, tpm_feature, tpm_basket, reserved}
"""

# KEYS: the RPM and TPM keys of the current windows. ARGV: feature, RPM amount, TPM amount,
# TTL. A positive amount is added to the feature and the basket, and renews the key's TTL.
COUNT_SCRIPT = """
for i, key in ipairs(KEYS) do
  local amount = tonumber(ARGV[i + 1])
  if amount > 0 then
    redis.call('HINCRBY', key, ARGV[1], amount)
    redis.call('HINCRBY', key, '__basket__', amount)
    redis.call('EXPIRE', key, tonumber(ARGV[4]))
  end
end
return 1
"""


class ContractsRedisUnreachable(Exception):
    """At start, with traffic contracts enabled, Redis did not answer PING: the service does
    not start (the reference's rule; TRAFFIC_CONTRACT_FAIL_OPEN_ON_REDIS_ERROR does not cover it)."""


@dataclass(frozen=True, slots=True)
class Limits:
    feature: int
    basket: int

    @property
    def checked(self) -> bool:
        return self.feature > 0 or self.basket > 0


@dataclass(frozen=True, slots=True)
class Decision:
    """One dimension's classification of one request."""

    dimension: str  # "RPM" or "TPM"
    mode: str
    limited_by: str | None  # "basket", "feature", or None when within contract
    ratio_over: float
    feature_count: int
    basket_count: int
    retry_after_seconds: int

    @property
    def allowed(self) -> bool:
        return self.limited_by is None


def decide(dimension: str, feature_count: int, basket_count: int, limits: Limits, retry_after: int) -> Decision:
    """The reference's rule: the basket first, then the feature; equality is within contract."""
    if limits.basket > 0 and basket_count > limits.basket:
        return Decision(dimension, DEGRADED, "basket", basket_count / limits.basket, feature_count, basket_count, retry_after)
    if limits.feature > 0 and feature_count > limits.feature:
        return Decision(dimension, BORROWED, "feature", feature_count / limits.feature, feature_count, basket_count, retry_after)
    return Decision(dimension, NORMAL, None, 0.0, max(feature_count, 0), max(basket_count, 0), retry_after)


def window_start(now: float, window: int) -> int:
    return int(now // window) * window


def seconds_left(now: float, window: int) -> int:
    """Until the window ends, whole seconds, at least 1 (a `Retry-After`)."""
    return max(1, math.ceil(window - (now % window)))


@dataclass(frozen=True, slots=True)
class Admission:
    """What the check decided for one request, and what its count after upstream needs."""

    service_type: str
    feature: str
    rpm: Decision
    tpm: Decision
    # Enforcing mode: the request's RPM was counted as it was admitted.
    reserved: bool

    @property
    def modes(self) -> tuple[str, str]:
        return self.rpm.mode, self.tpm.mode

    @property
    def over_basket(self) -> bool:
        return self.rpm.mode == DEGRADED or self.tpm.mode == DEGRADED

    @property
    def retry_after_seconds(self) -> int:
        """Until every over-basket dimension's window ends."""
        return max(d.retry_after_seconds for d in (self.rpm, self.tpm) if d.mode == DEGRADED)


class TrafficContracts:
    """`admit(service_type)` before upstream; `count_after(...)` once the request ended."""

    def __init__(
        self,
        settings: TrafficContractSettings,
        link: RedisLink,
        traffic_features: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.enforcing = settings.reject_over_contract
        self._link = link
        self._clock = clock
        names = {
            TRAFFIC_FEATURE_SMART_WINDOW: settings.smart_window_feature,
            TRAFFIC_FEATURE_S2S: settings.s2s_feature,
            TRAFFIC_FEATURE_S2S_ANDROID: settings.s2s_android_feature,
        }
        limits = {
            TRAFFIC_FEATURE_SMART_WINDOW: (settings.smart_window_rpm_limit, settings.smart_window_tpm_limit),
            TRAFFIC_FEATURE_S2S: (settings.s2s_rpm_limit, settings.s2s_tpm_limit),
            TRAFFIC_FEATURE_S2S_ANDROID: (settings.s2s_android_rpm_limit, settings.s2s_android_tpm_limit),
        }
        # Service type -> (feature name, RPM limits, TPM limits).
        self._contracts = {
            service_type: (
                names[feature],
                Limits(limits[feature][0], settings.total_rpm_limit),
                Limits(limits[feature][1], settings.total_tpm_limit),
            )
            for service_type, feature in traffic_features.items()
        }
        self._check = link.client.register_script(CHECK_SCRIPT)
        self._count = link.client.register_script(COUNT_SCRIPT)
        # Counts not yet written: (RPM key, TPM key, feature) -> [requests, tokens]. At most a
        # few entries (the windows and features of the last interval), so bounded by nature.
        self._unflushed: dict[tuple[str, str, str], list[int]] = {}
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None

    def keys(self, now: float) -> tuple[str, str]:
        prefix, s = self.settings.key_prefix, self.settings
        return (
            f"{prefix}:rpm:{window_start(now, s.rpm_window_seconds)}",
            f"{prefix}:tpm:{window_start(now, s.tpm_window_seconds)}",
        )

    async def ping(self) -> None:
        """The start-up check: raises ContractsRedisUnreachable when Redis does not answer."""
        # Not through the link's episodes: this failure is the start-up error's one line.
        try:
            async with asyncio.timeout(self._link.bound_seconds):
                await self._link.client.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            redis = self._link.client.connection_pool.connection_kwargs
            raise ContractsRedisUnreachable(
                f"Redis at {redis.get('host')}:{redis.get('port')} did not answer PING ({type(exc).__name__})"
            ) from None

    async def admit(self, service_type: str) -> Admission | None:
        """The check before upstream. None: not checked (no contract for the type, or Redis
        failed and the contracts fail open). Raises TrafficContractUnavailable (fail-closed)
        or OverTrafficContract (enforcing, over the basket)."""
        contract = self._contracts.get(service_type)
        if contract is None:
            return None
        feature, rpm_limits, tpm_limits = contract
        s = self.settings
        now = self._clock()
        args = (feature, rpm_limits.feature, rpm_limits.basket, tpm_limits.feature, tpm_limits.basket,
                1 if self.enforcing else 0, s.counter_ttl_seconds)  # fmt: skip
        keys = self.keys(now)
        try:
            counts: Any = await self._link.run(
                "traffic_contract_check", lambda client: self._check(keys=keys, args=args, client=client)
            )
        except RedisUnavailable:
            # The link logs once per failure episode and counts every failure.
            if s.fail_open:
                return None
            raise TrafficContractUnavailable() from None
        rpm_feature, rpm_basket, tpm_feature, tpm_basket, reserved = (int(c) for c in counts)
        admission = Admission(
            service_type,
            feature,
            decide("RPM", rpm_feature, rpm_basket, rpm_limits, seconds_left(now, s.rpm_window_seconds)),
            decide("TPM", tpm_feature, tpm_basket, tpm_limits, seconds_left(now, s.tpm_window_seconds)),
            reserved=bool(reserved),
        )
        for decision in (admission.rpm, admission.tpm):
            if not decision.allowed:
                log.warning(
                    "traffic_contract_exceeded",
                    dimension=decision.dimension,
                    service_type=service_type,
                    feature=feature,
                    limited_by=decision.limited_by,
                    mode=decision.mode,
                    ratio_over=round(decision.ratio_over, 3),
                    feature_count=decision.feature_count,
                    basket_count=decision.basket_count,
                )
        if self.enforcing and admission.over_basket:
            raise OverTrafficContract(admission.retry_after_seconds, admission.modes)
        return admission

    def count_after(self, service_type: str, admission: Admission | None, total_tokens: int, content_deltas: int | None) -> None:
        """Count a request that reached upstream, for the flusher: RPM +1 (unless reserved at
        admission), TPM + LiteLLM's `total_tokens` when it reported one; enforcing, a stream
        without it counts `content_deltas`, an estimate (the log field
        `traffic_contract_tokens_estimated`). Synchronous: safe where a handler is cancelled."""
        contract = self._contracts.get(service_type)
        if contract is None:
            return
        requests = 0 if admission is not None and admission.reserved else 1
        tokens, estimated = total_tokens, False
        if not tokens and self.enforcing and content_deltas:
            tokens, estimated = content_deltas, True
        if tokens:
            log_context.bind(traffic_contract_tokens=tokens, traffic_contract_tokens_estimated=estimated)
        if not requests and not tokens:
            return
        rpm_key, tpm_key = self.keys(self._clock())
        entry = self._unflushed.get((rpm_key, tpm_key, contract[0]))
        if entry is None:
            self._unflushed[(rpm_key, tpm_key, contract[0])] = [requests, tokens]
            self._wake.set()
        else:
            entry[0] += requests
            entry[1] += tokens

    @property
    def pending_counts(self) -> int:
        """Counts not yet written to Redis (or being written)."""
        return len(self._unflushed) + self._in_flight

    def start(self) -> None:
        """The one flusher task, for the app's lifetime (`close` ends it)."""
        self._flusher = asyncio.get_running_loop().create_task(self._flush_while_open())

    async def _flush_while_open(self) -> None:
        while not self._closing.is_set():
            await self._wake.wait()
            # Gather the counts of one interval (shutdown cuts the wait short).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), FLUSH_INTERVAL_SECONDS)
            self._wake.clear()
            try:
                await self._flush()
            except Exception:  # a bug, not Redis (the link turns Redis's failures into RedisUnavailable)
                # The flusher must outlive it: counts would otherwise pile up unwritten.
                log.exception("traffic_contract_flush_failed")

    async def _flush(self) -> None:
        batch, self._unflushed = self._unflushed, {}
        self._in_flight = len(batch)
        ttl = self.settings.counter_ttl_seconds
        try:
            for (rpm_key, tpm_key, feature), (requests, tokens) in batch.items():
                args = (feature, requests, tokens, ttl)
                # A failed write is lost; the link logs once per episode and counts every failure.
                with contextlib.suppress(RedisUnavailable):
                    await self._link.run("traffic_contract_count", functools.partial(self._write, (rpm_key, tpm_key), args))
        finally:
            self._in_flight = 0

    def _write(self, keys: tuple[str, str], args: tuple[Any, ...], client: Any) -> Awaitable[Any]:
        return self._count(keys=keys, args=args, client=client)

    async def close(self) -> None:
        """At shutdown: the flusher ends after writing what was counted (each call bounded by
        the link), so nothing is left pending."""
        self._closing.set()
        self._wake.set()
        if self._flusher is not None:
            await self._flusher
        if self._unflushed:
            await self._flush()
