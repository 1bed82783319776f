"""`GET /metrics`: the Prometheus exposition, with the signup-capacity gauges read fresh."""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST

from .. import keys
from ..observability.metrics import exposition
from ..store.base import StoreUnavailable

log = structlog.get_logger(__name__)


async def _refresh_signup_capacity(app: web.Application) -> None:
    """The capacity gauges from the store (one primary-key row), bounded like readiness;
    on failure the gauges keep their last values and the scrape still answers."""
    settings, metrics = app[keys.SETTINGS], app[keys.METRICS]
    metrics.signup_cap_enforced.set(1 if settings.signup_cap.enforce else 0)
    try:
        state = await asyncio.wait_for(app[keys.STORE].capacity_state(), settings.postgres.readiness_check_timeout_s)
    except (StoreUnavailable, asyncio.TimeoutError) as exc:
        log.warning("metrics_signup_capacity_unavailable", error_type=type(exc).__name__)
        return
    if state is not None:
        metrics.signup_capacity_max.set(state.max_identities)
        metrics.signup_capacity_current.set(state.current_identities)


async def scrape(request: web.Request) -> web.Response:
    settings = request.app[keys.SETTINGS]
    await _refresh_signup_capacity(request.app)
    payload = exposition(request.app[keys.METRICS], settings.observability.prometheus_multiproc_dir)
    return web.Response(body=payload, headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})
