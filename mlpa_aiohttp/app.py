"""Application assembly.

`create_app(settings)` is pure: it wires collaborators from settings and never reads the
environment (tests call it directly). `app_factory()` is the gunicorn worker's entry
(`mlpa_aiohttp.app:app_factory`): it reads the settings from `os.environ` and configures
process-wide logging.

Who else reads the environment, and why. Every variable of the service is parsed by
`Settings.from_environ` (settings/__init__.py); its other callers are the CLI (`__main__.py`: serve,
demo, migrate), gunicorn's master (config/gunicorn.conf.py, which alone parses
GUNICORN_WORKERS, WEB_CONCURRENCY and GUNICORN_WORKER_CLASS) and test tools. Besides it:
* `settings/compat.warn_about_environment` looks at every variable's name (never its value)
  for renamed, retired and misspelled ones; here and in the CLI.
* `process/startup.json_logs_requested` reads LOG_JSON leniently, so that a start-up
  failure (even an invalid LOG_JSON) is reported in the requested format; the CLI (`migrate`
  included), gunicorn.conf.py and process/gunicorn_worker.py hand it `os.environ` for that.
* `__main__`'s demo reads MLPA_UI_ACCESS_KEY to print it, or makes a random one.
* observability/metrics.py checks PROMETHEUS_MULTIPROC_DIR itself: prometheus_client
  switches to multiprocess mode on that variable, not on our settings.
* sentry-sdk reads SENTRY_ENVIRONMENT (observability/sentry.py).

Startup order (cleanup contexts run in this order, and unwind in reverse):
1. the shared upstream ClientSession and the LiteLLM client;
2. the stores (memory, or the two Postgres pools): budgets upserted, capacity seeded;
3. authentication: FxA, App Attest, Play Integrity (Google credentials are loaded lazily);
4. Redis, only when a feature uses it (`fleet.uses_redis`), the traffic contracts on it
   (when enabled: Redis must answer PING, or the service does not start) and the fleet-wide
   stream cap's task.
Shutdown: `on_shutdown` drains open streams (compatibility.md D6) before the contexts unwind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from . import __version__, fleet, keys
from .auth.app_attest import AppAttest
from .auth.dispatch import Authenticator
from .auth.fxa import FxAVerifier
from .auth.play import PlayIntegrity
from .fleet.redis_link import RedisLink
from .fleet.stream_cap import FleetStreamCap
from .fleet.traffic_contracts import TrafficContracts
from .middlewares import add_security_headers, error_mapping, request_context, request_timings
from .models import RequestRules
from .observability.logging import configure_logging
from .observability.metrics import Metrics
from .observability.sentry import init_sentry, secret_values
from .observability.server_log import ServerLogger
from .process.gc_tuning import settle_heap
from .process.overload import LoadMonitor, on_response_prepare, sampler_context, shedding_middleware
from .relay.keepalive import FirstByteKeepAlive
from .relay.stream import TakeOver
from .relay.tracker import StreamTracker
from .routes import setup_routes
from .routes.admin_port import listener_split
from .settings import Settings, variable_names
from .settings.compat import warn_about_environment
from .store.app_attest import (
    ChallengeStore,
    MemoryChallengeStore,
    MemoryPublicKeyStore,
    PostgresChallengeStore,
    PostgresPublicKeyStore,
    PublicKeyStore,
)
from .store.base import UserStore
from .store.budget_links import BudgetLinks
from .store.memory import MemoryUserStore
from .store.pools import open_pools
from .store.postgres import PostgresUserStore
from .store.provisioning import Provisioner
from .store.schema import SchemaWatch
from .stream_slots import StreamSlots
from .upstream.google import GoogleAccessTokenProvider
from .upstream.litellm import LiteLLMClient, open_session
from .upstream.privacy_filter import PrivacyFilterClient
from .upstream.reachability import warn_if_litellm_unreachable

MAX_HEADER_FIELD_BYTES = 32 * 1024


def create_app(settings: Settings) -> web.Application:
    metrics = Metrics(
        CollectorRegistry(auto_describe=True),
        multiprocess=settings.observability.prometheus_multiproc_dir is not None,
        catalog=settings.catalog,
        launch_countries=settings.observability.launch_countries,
    )
    streams = StreamTracker()
    monitor = LoadMonitor(settings.overload, streams.open_count, metrics) if settings.overload.enabled else None
    # Overload shedding comes first, before even the log line (process/overload.py says why).
    shedding = [shedding_middleware(monitor)] if monitor is not None else []
    # With MLPA_ADMIN_PORT, innermost: its 404 gets error_mapping's body and a log line.
    admin_port = settings.server.admin_port
    listeners = [listener_split(admin_port)] if admin_port is not None else []
    app = web.Application(
        # Timing spans next (middlewares.py): only requests with `debug-timing: true` get any.
        middlewares=[*shedding, request_timings, request_context, error_mapping, *listeners],
        client_max_size=settings.server.max_request_size_bytes,
        # Cancel the handler when the client's connection is lost: the disconnect
        # signal costs nothing while a stream idles. Set here, not on a runner, so
        # gunicorn's worker, run_app and the test server all behave the same.
        handler_args={
            "handler_cancellation": True,
            "keepalive_timeout": settings.server.keepalive_timeout_seconds,
            # A real App Attest attestation travels in `Authorization` as a JWT of about
            # 10.7 KB; aiohttp's default 8190-byte field limit turned every real device's
            # attestation into a 400 before it reached the verifier.
            "max_field_size": MAX_HEADER_FIELD_BYTES,
            # Malformed HTTP is a counted WARNING, not an ERROR with a traceback.
            "logger": ServerLogger(metrics),
        },
    )
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics
    app[keys.REQUEST_RULES] = RequestRules(settings.catalog)
    app[keys.STREAMS] = streams
    app[keys.RELAY_FAST_PATH] = _relay_fast_path(settings)
    if monitor is not None:
        app[keys.OVERLOAD] = monitor
        app.cleanup_ctx.append(lambda _app: sampler_context(monitor))
        if settings.overload.max_admissions:
            app.on_response_prepare.append(on_response_prepare(monitor))
    app[keys.STREAM_SLOTS] = StreamSlots(settings.stream_limits.max_concurrent_streams_per_user)
    if settings.stream_limits.keepalive_seconds > 0:
        app[keys.STREAM_KEEPALIVE] = FirstByteKeepAlive(settings.stream_limits.keepalive_seconds, metrics)
    app.cleanup_ctx.append(_worker_gc_metrics_context)
    app.cleanup_ctx.append(_keepalive_context)
    app.cleanup_ctx.append(_upstream_context)
    app.cleanup_ctx.append(_store_context)
    app.cleanup_ctx.append(_auth_context)
    app.cleanup_ctx.append(_redis_context)
    app.cleanup_ctx.append(_traffic_contracts_context)
    app.cleanup_ctx.append(_fleet_stream_cap_context)
    app.on_shutdown.append(_drain_streams)
    app.on_response_prepare.append(add_security_headers)
    setup_routes(app)
    return app


def _relay_fast_path(settings: Settings) -> TakeOver:
    """RELAY_FAST_PATH, checked once against the running aiohttp (relay/fast_path.usable);
    the module is imported only when it is on."""
    if not settings.stream_limits.relay_fast_path:
        return None
    from .relay import fast_path

    return fast_path.FastRelay.take_over if fast_path.usable() else None


async def _run_while_serving(run: Callable[[], Coroutine[Any, Any, None]] | None) -> AsyncIterator[None]:
    """One app-wide background loop for the app's lifetime (none when `run` is None)."""
    task = asyncio.create_task(run()) if run is not None else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _worker_gc_metrics_context(app: web.Application) -> AsyncIterator[None]:
    """GC pauses timed for the app's life; under several workers, each copies its GC
    statistics for the others' scrapes."""
    metrics = app[keys.METRICS]
    gc_counters = metrics.gc_counters
    metrics.gc_pauses.install()
    try:
        async for _ in _run_while_serving(gc_counters.run if gc_counters is not None else None):
            yield
    finally:
        metrics.gc_pauses.uninstall()


async def _keepalive_context(app: web.Application) -> AsyncIterator[None]:
    """The one app-wide keep-alive tick, only when keep-alive lines are enabled."""
    keepalive = app.get(keys.STREAM_KEEPALIVE)
    async for _ in _run_while_serving(keepalive.run if keepalive is not None else None):
        yield


async def _upstream_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[keys.SETTINGS]
    async with open_session(settings.upstream) as session:
        app[keys.HTTP_SESSION] = session
        app[keys.LITELLM] = LiteLLMClient(session, settings.upstream, app[keys.METRICS])
        app[keys.PRIVACY_FILTER] = PrivacyFilterClient(session, settings.privacy_filter)
        watch = asyncio.create_task(app[keys.STREAMS].watch_silence(settings.upstream.streaming_timeout_seconds))
        try:
            yield
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)


async def _store_context(app: web.Application) -> AsyncIterator[None]:
    """Users, App Attest challenges and keys: in memory, or in PostgreSQL."""
    settings = app[keys.SETTINGS]
    async with contextlib.AsyncExitStack() as stack:
        if settings.store == "memory":
            store: UserStore = MemoryUserStore(app[keys.LITELLM])
            challenges: ChallengeStore = MemoryChallengeStore(settings.app_attest.challenge_expiry_seconds)
            public_keys: PublicKeyStore = MemoryPublicKeyStore()
        else:
            pools = await stack.enter_async_context(open_pools(settings.postgres))
            app[keys.PG_POOLS] = pools
            schema = SchemaWatch(pools.app, settings.postgres.app_attest_db_name)
            await schema.check_at_start()
            app[keys.SCHEMA_WATCH] = schema
            store = PostgresUserStore.from_settings(pools, app[keys.LITELLM], settings)
            challenges = PostgresChallengeStore(pools.app, settings.app_attest.challenge_expiry_seconds)
            public_keys = PostgresPublicKeyStore(pools.app)
        budget_links = BudgetLinks(store, settings.budgets, app[keys.METRICS])
        await budget_links.ensure_at_start()
        await store.ensure_capacity_state(
            settings.signup_cap.max_signed_in_users, settings.signup_cap.capped_service_types
        )
        app[keys.STORE] = store
        app[keys.BUDGET_LINKS] = budget_links
        app[keys.PROVISIONER] = Provisioner(store, budget_links, settings.budgets.keys(), settings.signup_cap)
        app[keys.APP_ATTEST] = AppAttest(
            challenges=challenges, keys=public_keys, settings=settings.app_attest, metrics=app[keys.METRICS]
        )
        yield


async def _auth_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[keys.SETTINGS]
    google_tokens = GoogleAccessTokenProvider(settings.play.google_credentials)
    try:
        app[keys.PLAY_INTEGRITY] = PlayIntegrity(
            session=app[keys.HTTP_SESSION],
            google_tokens=google_tokens,
            settings=settings.play,
            auth=settings.auth,
            metrics=app[keys.METRICS],
            debug=settings.server.debug,
        )
        app[keys.AUTHENTICATOR] = Authenticator(
            fxa=FxAVerifier(app[keys.HTTP_SESSION], settings.fxa),
            metrics=app[keys.METRICS],
            dev_token=settings.auth.experimentation_token,
            app_attest=app[keys.APP_ATTEST],
            play_integrity=app[keys.PLAY_INTEGRITY],
            dev_types=settings.catalog.dev_types,
        )
        yield
    finally:
        google_tokens.close()


async def _redis_context(app: web.Application) -> AsyncIterator[None]:
    """The worker's one Redis link, only when a feature uses Redis (it connects on first use)."""
    settings = app[keys.SETTINGS]
    if not fleet.uses_redis(settings):
        yield
        return
    link = RedisLink(settings.redis, app[keys.METRICS])
    app[keys.REDIS] = link
    try:
        yield
    finally:
        await link.close()


async def _traffic_contracts_context(app: web.Application) -> AsyncIterator[None]:
    """Traffic contracts when enabled: Redis must answer at start; their one flusher task
    writes the counts, and at shutdown what is left before the link closes."""
    settings = app[keys.SETTINGS]
    if not settings.traffic_contracts.enabled:
        yield
        return
    contracts = TrafficContracts(settings.traffic_contracts, app[keys.REDIS], settings.catalog.traffic_features)
    await contracts.ping()
    contracts.start()
    app[keys.TRAFFIC_CONTRACTS] = contracts
    try:
        yield
    finally:
        await contracts.close()


async def _fleet_stream_cap_context(app: web.Application) -> AsyncIterator[None]:
    """STREAM_CAP_SCOPE=fleet: the leases' one app-wide task; at the end (after the drain) the
    last releases are sent before the link closes."""
    settings = app[keys.SETTINGS]
    if not fleet.fleet_stream_cap_enabled(settings):
        yield
        return
    cap = FleetStreamCap(
        app[keys.STREAM_SLOTS],
        app[keys.REDIS],
        lease_seconds=settings.stream_cap.lease_seconds,
        metrics=app[keys.METRICS],
    )
    app[keys.FLEET_STREAM_CAP] = cap
    async for _ in _run_while_serving(cap.run):
        yield
    await cap.close()


async def _litellm_reachability_context(app: web.Application) -> AsyncIterator[None]:
    """The start-up check of LiteLLM in the background, cancelled if the app stops first."""
    check = asyncio.create_task(warn_if_litellm_unreachable(app[keys.SETTINGS].upstream))
    try:
        yield
    finally:
        check.cancel()
        await asyncio.gather(check, return_exceptions=True)


async def _drain_streams(app: web.Application) -> None:
    await app[keys.STREAMS].shutdown(app[keys.SETTINGS].server.shutdown_drain_seconds)


async def _settle_heap(app: web.Application) -> None:
    server = app[keys.SETTINGS].server
    settle_heap(server.gc_young_threshold, freeze=server.gc_freeze_after_startup)


async def app_factory() -> web.Application:
    """The gunicorn entry point: configuration from the process environment."""
    settings = Settings.from_environ(os.environ)
    configure_logging(level=settings.server.log_level, json=settings.server.log_json)
    warn_about_environment(os.environ, variable_names())
    init_sentry(settings.observability.sentry_dsn, release=__version__, secrets=secret_values(settings))
    app = create_app(settings)
    # One WARNING if LiteLLM is not there at start-up; start-up does not wait for it.
    app.cleanup_ctx.append(_litellm_reachability_context)
    # After every cleanup context (they run at on_startup's first entry): the heap is complete.
    app.on_startup.append(_settle_heap)
    return app
