"""Every URL of the service, in one place."""

from __future__ import annotations

from aiohttp import web

from . import health, proxy
from .admin import setup_admin_routes
from .verify import setup_verify_routes


def setup_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/health/liveness", health.liveness)
    router.add_get("/health/readiness", health.readiness)
    router.add_get("/metrics", health.metrics)
    router.add_post("/v1/chat/completions", proxy.chat_completions)
    router.add_post("/v1/search", proxy.search)
    setup_verify_routes(app)
    setup_admin_routes(app)
