"""`GET /v1/usage`: the caller's own spend and budget limits for one service type.

Authenticated by the auth step the chat and search routes share (`proxy.authenticate_caller`):
the same headers, purpose rules and auth chain. The user id read is the authenticated
principal's and nothing else: no query parameter or header can name another user.
A user LiteLLM does not know yet is 404 (reading must not claim a signup slot or create
a LiteLLM customer); a blocked user is 403, as on chat.
"""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web

from .. import keys
from ..errors import NotFound, RequestInvalid, ServerFault, UserBlocked
from ..store.base import BudgetUsage, StoreUnavailable
from .proxy import authenticate_caller

log = structlog.get_logger(__name__)

USER_NOT_FOUND = "User not found"
USAGE_FAILED = {"error": "Error fetching usage"}


async def usage(request: web.Request) -> web.Response:
    errors: list[dict[str, Any]] = []
    headers = request.app[keys.REQUEST_RULES].parse_proxy_headers(request.headers, errors)
    if errors or headers is None:
        raise RequestInvalid(errors)
    # A GET has no body: App Attest callers sign the empty body.
    principal = await authenticate_caller(request, headers, b"")
    try:
        found = await request.app[keys.STORE].get_usage(principal.user_id)
    except StoreUnavailable as exc:
        log.error("usage_read_failed", error=str(exc))
        raise ServerFault(USAGE_FAILED) from None
    if found is None:
        raise NotFound(USER_NOT_FOUND)
    if found.blocked:
        raise UserBlocked()
    return web.json_response(usage_body(principal.service_type, found))


def usage_body(service_type: str, usage: BudgetUsage) -> dict[str, Any]:
    remaining = None if usage.max_budget is None else max(0.0, usage.max_budget - usage.spend)
    return {
        "service_type": service_type,
        "spend": usage.spend,
        "max_budget": usage.max_budget,
        "remaining_budget": remaining,
        "budget_duration": usage.budget_duration,
        "budget_reset_at": None if usage.budget_reset_at is None else usage.budget_reset_at.isoformat(),
        "tpm_limit": usage.tpm_limit,
        "rpm_limit": usage.rpm_limit,
    }
