"""Health probes (compatibility.md §1.2)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from .. import __version__, keys
from ..process.overload import readiness_body
from ..store.base import MEMORY_STORE_STATE
from ..store.schema import SchemaDifference

log = structlog.get_logger(__name__)


async def liveness(request: web.Request) -> web.Response:
    """No I/O: 200 while the event loop runs."""
    return web.json_response({"status": "alive"})


async def readiness(request: web.Request) -> web.Response:
    app = request.app
    timeout = app[keys.SETTINGS].postgres.readiness_check_timeout_s
    databases, litellm, version, privacy_filter = await asyncio.gather(
        _databases(app, timeout),
        _litellm_readiness(app, timeout),
        _litellm_version(app, timeout),
        _privacy_filter_readiness(app, timeout),
    )
    filter_ready, filter_body = privacy_filter
    litellm_ok = (
        isinstance(litellm, dict)
        and litellm.get("db") == "connected"
        and litellm.get("status") in ("healthy", "connected")
    )
    # compatibility.md §1.2: the version under `version` (the reference's key since 1.0.39),
    # LiteLLM's own JSON merged after it.
    litellm_body: dict[str, Any] = {"version": version}
    if isinstance(litellm, dict):
        litellm_body.update(litellm)
    else:
        litellm_body["status"] = "unreachable"
    monitor = app.get(keys.OVERLOAD)
    overload = monitor.state() if monitor is not None else None
    schema = await _schema(app, timeout)
    dependencies_ok = all(databases.values()) and litellm_ok and filter_ready
    own_health_ok = not app[keys.STREAMS].shutting_down and overload is None and (schema is None or schema.complete)
    _record_dependencies(app, databases, litellm_ok, filter_ready)
    # compatibility.md D64: the dependencies decide readiness only when asked to; `status` keeps
    # saying whether everything answered, the status code whether to send this pod traffic.
    ready = own_health_ok and (dependencies_ok or not app[keys.SETTINGS].readiness.requires_dependencies)
    if app[keys.STORE].backend == "memory":
        # No database behind the in-memory store (the demo): say so rather than "connected".
        db_states = {name: MEMORY_STORE_STATE for name in databases}
    else:
        db_states = {name: "connected" if ok else "offline" for name, ok in databases.items()}
    body = {
        "status": "connected" if ready and dependencies_ok else "degraded",
        "mlpa_version": __version__,
        "pg_server_dbs": db_states,
        "litellm": litellm_body,
        "privacy_filter": filter_body,
    }
    if overload is not None:
        # Beyond the reference: only while overload protection says this worker is overloaded.
        body["overload"] = readiness_body(overload)
    if schema is not None and (schema.missing or schema.unknown):
        # Beyond the reference: only while the app database's migrations differ from this release's.
        body["app_database_schema"] = schema.body()
    return web.json_response(body, status=200 if ready else 503)


def _record_dependencies(
    app: web.Application, databases: dict[str, bool], litellm_ok: bool, filter_ready: bool
) -> None:
    gauge = app[keys.METRICS].dependency_up
    gauge.labels("litellm").set(1 if litellm_ok else 0)
    if app[keys.SETTINGS].privacy_filter.enabled:
        gauge.labels("privacy_filter").set(1 if filter_ready else 0)
    if app[keys.STORE].backend != "memory":  # the demo's store has no database to speak of
        for name, ok in databases.items():
            gauge.labels(name).set(1 if ok else 0)


async def _schema(app: web.Application, timeout: float) -> SchemaDifference | None:
    """The app database's migrations against this release's (store/schema.py); none without PostgreSQL."""
    watch = app.get(keys.SCHEMA_WATCH)
    return await watch.ready(timeout) if watch is not None else None


async def _databases(app: web.Application, timeout: float) -> dict[str, bool]:
    try:
        return await asyncio.wait_for(app[keys.STORE].ping(), timeout)
    except Exception as exc:
        log.warning("readiness_database_check_failed", error_type=type(exc).__name__)
        return {"postgres": False, "app_attest": False}


async def _litellm_readiness(app: web.Application, timeout: float) -> dict[str, Any] | None:
    """LiteLLM's readiness JSON if it answered 200 with an object, else None."""
    try:
        reply = await app[keys.LITELLM].readiness(timeout)
        if reply.status != 200:
            return None
        parsed = json.loads(reply.text)
        return parsed if isinstance(parsed, dict) else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        log.warning("readiness_litellm_check_failed", error_type=type(exc).__name__)
        return None


async def _litellm_version(app: web.Application, timeout: float) -> str:
    try:
        version = await app[keys.LITELLM].version(timeout)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        version = None
    return version or "N/A"


PRIVACY_FILTER_DISABLED = {"status": "disabled"}
PRIVACY_FILTER_UNREACHABLE = {"version": "N/A", "status": "unreachable"}


async def _privacy_filter_readiness(app: web.Application, timeout: float) -> tuple[bool, dict[str, Any]]:
    """Whether the Privacy Filter is ready (always, while it is off), and its readiness entry.
    Ready only on a 200 whose JSON says `"ready": true`; any JSON object answered with 200
    reports its `version` and `model_id`, ready or not."""
    if not app[keys.SETTINGS].privacy_filter.enabled:
        return True, dict(PRIVACY_FILTER_DISABLED)
    try:
        status, payload = await app[keys.PRIVACY_FILTER].readiness(timeout)
    except (TimeoutError, aiohttp.ClientError) as exc:
        log.warning("readiness_privacy_filter_check_failed", error_type=type(exc).__name__)
        return False, dict(PRIVACY_FILTER_UNREACHABLE)
    if status != 200 or not isinstance(payload, dict):
        return False, dict(PRIVACY_FILTER_UNREACHABLE)
    return payload.get("ready") is True, {"version": payload.get("version"), "model_id": payload.get("model_id")}
