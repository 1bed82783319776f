"""Overload protection (beyond the reference; OVERLOAD_* settings, off by default).

A worker that admits more new requests than it can serve makes every one of them wait:
connections queue in the kernel and in the event loop, clients give up, the open streams'
events arrive late, and readiness keeps saying ready so the balancer keeps sending. With
the protection on, the worker knows when it is overloaded and says so early instead:

* One app-wide sampler task sleeps a fixed period; how late it wakes is the event-loop lag
  (no per-request or per-stream timer). A sample above OVERLOAD_LAG_ENTER_MS starts
  shedding, the first one below OVERLOAD_LAG_LEAVE_MS stops it: shedding follows the lag
  sample by sample, so the worker keeps serving what it can (a hold there left it idle,
  shedding everything, for the whole hold: fewer served than with no protection at all).
  Readiness has the hold: not-ready from the first sample above the enter bound until the
  lag stayed below the leave bound for OVERLOAD_RECOVER_SECONDS.
* The accept queue: connections the kernel completed that the worker has not accepted yet
  (the listening sockets' queue length, read by the sampler with one TCP_INFO getsockopt
  each). At OVERLOAD_MAX_ACCEPT_QUEUE (200) or more at two samples in a row (at one, while
  readiness still says overloaded) the worker sheds until a sample finds it shorter. This
  is the signal that keeps the 503s fast: a request waits in that queue before any code of
  ours sees it, and only a worker that sheds cheaply drains it faster than requests arrive;
  the lag alone said nothing about it (the benchmark's 503s waited seconds with lag-based
  shedding only).
* Optional bounds: open streams (OVERLOAD_MAX_OPEN_STREAMS) and admissions in flight
  (OVERLOAD_MAX_ADMISSIONS: requests between their arrival and their response headers; a
  stream's headers go out once auth and provisioning are done, before LiteLLM is asked, so
  its upstream connect is not counted).
* While overloaded, every new request but the health probes and /metrics gets a 503 with
  the reference's generic body and `Retry-After`, before any auth or provisioning work,
  counted in `mlpa_shed_requests_total{reason}`. Streams already open are never touched.
* The shedding middleware is the outermost one, before `request_context`: a shed request
  gets no canonical log line and no request metrics, because the line and its context would
  be most of what a shed costs (about 212k instructions, an eighth of a whole new stream:
  docs/performance.md, "New streams") and a worker that sheds must drain its accept queue
  faster than requests arrive. Instead each episode of shedding is logged twice: one WARNING
  `overload_shedding_started` (reason, lag) and one INFO `overload_shedding_ended` (how many
  were shed, for how long), and the counter counts every one.
* `/health/readiness` answers 503 with the reason while the lag state or a bound holds,
  and for OVERLOAD_RECOVER_SECONDS after, so Kubernetes steers new traffic elsewhere.

Requests whose client gave up before the service read them need nothing here: aiohttp's
connection-lost callback cancels the connection's handler task before a request queued on
it starts (handler cancellation is on), so such a request reaches no middleware, auth or
provisioning (tests/unit/test_overload.py pins it). One whose client leaves mid-way is
cancelled at its next await, as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import structlog
from aiohttp import web

from ..observability.labels import ACCEPT_QUEUE, ADMISSIONS, EVENT_LOOP_LAG, OPEN_STREAMS
from ..observability.metrics import Metrics
from ..settings import OverloadSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = structlog.get_logger(__name__)

# The reasons of `mlpa_shed_requests_total` (a bounded label set, SHED_REASONS) live with
# the other label sets in observability/labels.py: their series exist from start.

# Linux `struct tcp_info`: for a listening socket `tcpi_unacked` is the accept queue's
# current length (and `tcpi_sacked` its limit). Eight one-byte fields, then u32s:
# rto, ato, snd_mss, rcv_mss, unacked.
_TCP_INFO_UNACKED = struct.Struct("=I")
_TCP_INFO_UNACKED_OFFSET = 24
_TCP_INFO_SIZE = 104


def listening_sockets() -> list[socket.socket]:
    """This process's listening TCP sockets (gunicorn's inherited one, or run_app's), as
    duplicates: found through /proc/self/fd, so the app needs no handle on its server."""
    found: list[socket.socket] = []
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in descriptors:
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            candidate = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if (
                candidate.family in (socket.AF_INET, socket.AF_INET6)
                and candidate.type == socket.SOCK_STREAM
                and candidate.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            ):
                found.append(candidate)
                continue
        except OSError:
            pass
        candidate.close()
    return found


def accept_queue_length(listener: socket.socket) -> int:
    """Connections waiting for accept() on a listening socket (Linux; 0 where unknown)."""
    try:
        info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except (OSError, AttributeError):
        return 0
    if len(info) < _TCP_INFO_UNACKED_OFFSET + 4:
        return 0
    return _TCP_INFO_UNACKED.unpack_from(info, _TCP_INFO_UNACKED_OFFSET)[0]

# Never shed: the probes must tell the truth and the scrape must see the overload.
EXEMPT_PATHS = frozenset({"/health/liveness", "/health/readiness", "/metrics"})

# The body FastAPI's HTTPException gives a bare 503 (its status phrase), as the reference
# would, and as `middlewares.error_mapping` answers aiohttp's own 503.
SHED_BODY = json.dumps({"detail": "Service Unavailable"}).encode()

# Set on a request while it counts as an admission in flight.
_ADMITTING = web.RequestKey("overload_admitting", bool)


@dataclass(frozen=True, slots=True)
class OverloadState:
    """What readiness reports: why the worker is overloaded and the figures behind it."""

    reason: str
    event_loop_lag_ms: float
    # The largest lag since the worker became overloaded (what made it so).
    peak_event_loop_lag_ms: float
    accept_queue: int
    open_streams: int
    admissions: int


class LoadMonitor:
    """This worker's load, as the sampler last saw it, and the shedding decision.

    `tick(lag, now)` is the whole state machine (the sampler calls it every period);
    `open_streams` is read, never changed."""

    def __init__(
        self,
        settings: OverloadSettings,
        open_streams: Callable[[], int],
        metrics: Metrics,
        *,
        listeners: Callable[[], list[socket.socket]] = listening_sockets,
    ) -> None:
        """`listeners` finds the sockets whose accept queue is watched (by default this
        process's listening sockets, looked up until some are found: the server may start
        listening after the app)."""
        self.settings = settings
        self._find_listeners = listeners
        self._listeners: list[socket.socket] = []
        self.accept_queue = 0
        self._queue_shedding = False
        self._queue_was_over = False
        self._listener_scans_left = 50
        self._open_streams = open_streams
        self._metrics = metrics
        self.admissions = 0
        self.last_lag = 0.0
        self._lag_overloaded = False  # readiness: with the recover hold
        self._lag_shedding = False  # shedding: sample by sample
        self._peak_lag = 0.0
        self._calm_since: float | None = None
        # Readiness: the last sample at which a bound (not the lag) held.
        self._bound_hot_at: float | None = None
        self._bound_reason: str | None = None
        self._now = 0.0
        # The current episode of shedding (for its two log lines).
        self._episode_started: float | None = None
        self._episode_shed = 0

    # -- the sampler --------------------------------------------------------------------
    async def run(self) -> None:
        """Run until cancelled: sleep one period, take the lateness as the lag."""
        loop = asyncio.get_running_loop()
        period = self.settings.sample_interval_ms / 1000
        while True:
            started = loop.time()
            await asyncio.sleep(period)
            now = loop.time()
            self.tick(max(0.0, now - started - period), now)

    def tick(self, lag: float, now: float) -> None:
        settings = self.settings
        self._now = now
        self.last_lag = lag
        self._metrics.event_loop_lag.observe(lag)
        if lag > settings.lag_enter_seconds:
            self._lag_shedding = True
        elif lag < settings.lag_leave_seconds:
            self._lag_shedding = False
        if lag > settings.lag_enter_seconds:
            self._lag_overloaded = True
            self._peak_lag = max(self._peak_lag, lag)
            self._calm_since = None
        elif self._lag_overloaded:
            if lag >= settings.lag_leave_seconds:
                self._calm_since = None
            elif self._calm_since is None:
                self._calm_since = now
            if self._calm_since is not None and now - self._calm_since >= settings.recover_seconds:
                self._lag_overloaded = False
                self._peak_lag = 0.0
                self._calm_since = None
        if settings.max_accept_queue:
            if not self._listeners and self._listener_scans_left:
                # Each scan reads every descriptor of the process: only while starting.
                self._listener_scans_left -= 1
                self._listeners = self._find_listeners()
            self.accept_queue = sum(accept_queue_length(listener) for listener in self._listeners)
            over = self.accept_queue >= settings.max_accept_queue
            # A calm worker sheds at the second sample in a row over the bound: one alone
            # is usually a burst it is already taking (a single one shed 1 % of a load the
            # unprotected worker served whole). Within an episode (readiness still 503)
            # one is enough: waiting a sample there let the open streams' events lag.
            self._queue_shedding = over and (self._queue_was_over or self._overloaded_at(now))
            self._queue_was_over = over
        bound = self._bound_exceeded()
        if self._queue_shedding:
            bound = ACCEPT_QUEUE
        if bound is not None:
            self._bound_hot_at, self._bound_reason = now, bound
        self._metrics.overloaded.set(1 if self.state() is not None else 0)
        if self._episode_started is not None and self.shed_reason() is None:
            log.info(
                "overload_shedding_ended",
                shed_requests=self._episode_shed,
                seconds=round(time.monotonic() - self._episode_started, 2),
            )
            self._episode_started = None

    def record_shed(self, reason: str) -> None:
        """A request was shed: counted; the first of an episode is logged."""
        self._metrics.shed_requests.labels(reason).inc()
        if self._episode_started is None:
            self._episode_started = time.monotonic()
            self._episode_shed = 0
            log.warning(
                "overload_shedding_started",
                reason=reason,
                event_loop_lag_ms=round(self.last_lag * 1000, 1),
                open_streams=self._open_streams(),
                admissions=self.admissions,
            )
        self._episode_shed += 1

    # -- the decisions ------------------------------------------------------------------
    def _overloaded_at(self, now: float) -> bool:
        """Whether this worker is within an episode: the lag state holds, or a bound held at
        a sample less than OVERLOAD_RECOVER_SECONDS ago (what readiness reports)."""
        if self._lag_overloaded:
            return True
        return self._bound_hot_at is not None and now - self._bound_hot_at < self.settings.recover_seconds

    def _bound_exceeded(self) -> str | None:
        settings = self.settings
        if settings.max_open_streams and self._open_streams() >= settings.max_open_streams:
            return OPEN_STREAMS
        if settings.max_admissions and self.admissions >= settings.max_admissions:
            return ADMISSIONS
        return None

    def shed_reason(self) -> str | None:
        """Why a new request must be shed now, or None: the lag (since a sample above the
        enter bound, until one below the leave bound), else a bound exceeded at this very
        moment (exact, no hold)."""
        if self._lag_shedding:
            return EVENT_LOOP_LAG
        if self._queue_shedding:
            return ACCEPT_QUEUE
        return self._bound_exceeded()

    def state(self) -> OverloadState | None:
        """What readiness reports: overloaded while the lag state holds, or a bound held at
        a sample less than OVERLOAD_RECOVER_SECONDS ago; None when not overloaded."""
        if self._lag_overloaded:
            reason: str | None = EVENT_LOOP_LAG
        elif self._bound_hot_at is not None and self._now - self._bound_hot_at < self.settings.recover_seconds:
            reason = self._bound_reason
        else:
            reason = self._bound_exceeded()
        if reason is None:
            return None
        return OverloadState(
            reason,
            round(self.last_lag * 1000, 1),
            round(self._peak_lag * 1000, 1),
            self.accept_queue,
            self._open_streams(),
            self.admissions,
        )

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners = []


def shed_response(retry_after_seconds: int) -> web.Response:
    response = web.Response(
        status=503,
        body=SHED_BODY,
        content_type="application/json",
        headers={"Retry-After": str(retry_after_seconds)},
    )
    # A client (or balancer) connection held open to an overloaded worker would bring its
    # next request here too: closing it lets the next one be balanced afresh.
    response.force_close()
    return response


def shedding_middleware(monitor: LoadMonitor) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The outermost middleware: a shed request costs no log line, auth, validation or
    provisioning (see the module's docstring)."""
    retry_after = monitor.settings.retry_after_seconds
    track_admissions = monitor.settings.max_admissions > 0

    @web.middleware
    async def shed_when_overloaded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in EXEMPT_PATHS:
            return await handler(request)
        reason = monitor.shed_reason()
        if reason is not None:
            monitor.record_shed(reason)
            return shed_response(retry_after)
        if not track_admissions:
            return await handler(request)
        monitor.admissions += 1
        request[_ADMITTING] = True
        try:
            return await handler(request)
        finally:
            admitted(request, monitor)

    return shed_when_overloaded


def admitted(request: web.Request, monitor: LoadMonitor) -> None:
    """The request's first response byte is on its way (or it ended): no longer admitting."""
    if request.get(_ADMITTING):
        request[_ADMITTING] = False
        monitor.admissions -= 1


def on_response_prepare(monitor: LoadMonitor) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """A stream stops being an admission when its headers go out, not when it ends."""

    async def end_admission(request: web.Request, response: web.StreamResponse) -> None:
        admitted(request, monitor)

    return end_admission


async def sampler_context(monitor: LoadMonitor) -> AsyncIterator[None]:
    """The one sampler task for the app's lifetime."""
    task = asyncio.create_task(monitor.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        monitor.close()


def readiness_body(state: OverloadState) -> dict[str, object]:
    """The `overload` object of the readiness body."""
    return {
        "reason": state.reason,
        "event_loop_lag_ms": state.event_loop_lag_ms,
        "peak_event_loop_lag_ms": state.peak_event_loop_lag_ms,
        "accept_queue": state.accept_queue,
        "open_streams": state.open_streams,
        "admissions": state.admissions,
    }
