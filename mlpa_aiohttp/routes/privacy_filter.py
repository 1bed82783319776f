"""`POST /privacy-filter` (compatibility.md §1.11): FxA-signed-in clients mask sensitive data in a batch
of strings through the Privacy Filter service.

Order, each step short-circuiting: the 422 of headers and body (also while the feature is
off); 503 while `PRIVACY_FILTER_ENABLED` is off (before authentication); FxA alone (401s as
the proxy routes'); then the Privacy Filter, whose every failure is one 502. No LiteLLM end
user is created and no budget applies. `POST /privacy-filter/` is redirected (307), as the
reference's framework does.
"""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import hdrs, web

from .. import keys
from ..errors import BadRequest, ServerFault, UpstreamError
from ..models import parse_privacy_filter
from ..observability import log_context
from ..observability.timing import AUTH, UPSTREAM, span
from ..upstream.bodies import encode_json
from ..upstream.privacy_filter import PrivacyFilterFailed
from .request_body import read_body

log = structlog.get_logger(__name__)

PATH = "/privacy-filter"
DISABLED = "Privacy Filter is disabled."
NO_USER = "User not found from authorization response."
PROXY_FAILED = "Failed to proxy request to Privacy Filter"


def setup_privacy_filter_routes(app: web.Application) -> None:
    app.router.add_post(PATH, privacy_filter)
    app.router.add_post(PATH + "/", redirect_to_privacy_filter)


async def privacy_filter(request: web.Request) -> web.Response:
    app = request.app
    settings = app[keys.SETTINGS]
    headers, body = parse_privacy_filter(await read_body(request), request.headers)
    timings = request[keys.REQUEST_TIMINGS]
    with span(timings, AUTH):
        if not settings.privacy_filter.enabled:
            raise ServerFault({"error": DISABLED}, status=503)
        uid = await app[keys.AUTHENTICATOR].fxa_uid(headers.authorization)
        if not uid:
            raise BadRequest({"error": NO_USER})
    log_context.bind(user=uid, auth_method="fxa")
    upstream_body = encode_json({"items": body.items})
    with span(timings, UPSTREAM):
        try:
            filtered = await app[keys.PRIVACY_FILTER].filter(upstream_body)
        except PrivacyFilterFailed as exc:
            log.error("privacy_filter_failed", reason=str(exc))
            raise UpstreamError(str(exc) if settings.server.debug else PROXY_FAILED, status=502) from None
    return web.Response(body=encode_json(_answer(filtered)), content_type="application/json")


def _answer(filtered: dict[str, Any]) -> dict[str, Any]:
    """Exactly the three keys clients read, defaulted when the filter left one out."""
    return {
        "results": filtered.get("results", []),
        "model_id": filtered.get("model_id"),
        "num_items": filtered.get("num_items", 0),
    }


async def redirect_to_privacy_filter(request: web.Request) -> web.Response:
    """The reference's trailing-slash redirect: 307 keeps the method and body."""
    location = PATH + (f"?{request.query_string}" if request.query_string else "")
    return web.Response(status=307, headers={hdrs.LOCATION: location})
