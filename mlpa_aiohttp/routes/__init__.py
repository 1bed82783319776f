"""The service's route groups, in one list: the probes, /metrics, the proxy and /v1/usage are
added here; the verify, admin, mock and docs groups add their own URLs in their modules'
`setup_*` functions, called from here."""

from __future__ import annotations

from aiohttp import web

from . import health, metrics, proxy, usage
from .admin import setup_admin_routes
from .docs import setup_docs_routes
from .mock import setup_mock_routes
from .privacy_filter import setup_privacy_filter_routes
from .verify import setup_verify_routes


def setup_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/health/liveness", health.liveness)
    router.add_get("/health/readiness", health.readiness)
    router.add_get("/metrics", metrics.scrape)
    router.add_post("/v1/chat/completions", proxy.chat_completions)
    router.add_post("/v1/search", proxy.search)
    # Beyond the reference: the caller's own budget and limits.
    router.add_get("/v1/usage", usage.usage)
    # The Privacy Filter proxy (FxA only, off by default) and its trailing-slash redirect.
    setup_privacy_filter_routes(app)
    # App Attest challenge/attestation and the Play Integrity token exchange.
    setup_verify_routes(app)
    # `/user/*` admin API and the `/admin` page: sub-apps, each route with a declared access level.
    setup_admin_routes(app)
    # Load-testing routes, only when MLPA_MOCK_ROUTES=true (compatibility.md D16).
    setup_mock_routes(app)
    # OpenAPI document and Swagger UI.
    setup_docs_routes(app)
