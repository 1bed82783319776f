"""The admin API under `/user` and the read-only dashboard at `/admin` (compatibility.md §1.6, §1.10).

Each is a sub-application whose routes are declared in a table with an `Access` level and
no default; the sub-application's middleware checks that level before any handler runs,
so a handler never authenticates by itself and cannot forget to. At startup the service
refuses to run if any route under `/user` or `/admin` lacks a declared level (one added
straight to a router, bypassing the tables).

Auth is by header, constant-time, full string including the `Bearer ` prefix:

* `master_key` (or `master-key`): list, lookup, budget, block, unblock;
* `mlpa_ui_access_key` (or `mlpa-ui-access-key`): counts and signup-cap status.

The keys are not interchangeable. A missing or wrong header is 401
`{"detail": {"error": "Unauthorized"}}` (compatibility.md D10 and D12). Database failures become
the reference's 500 bodies; nothing internal reaches a response body.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import importlib.resources
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import hdrs, web

from .. import keys
from ..errors import ApiError, AuthRejected, NotFound, RequestInvalid, ServerFault
from ..headers import CONTENT_SECURITY_POLICY
from ..headers import MASTER_KEY as MASTER_KEY_HEADERS
from ..headers import UI_ACCESS_KEY as UI_ACCESS_KEY_HEADERS
from ..models import BudgetUpdate, UsersPage, parse_query
from ..store.base import EndUser, StoreUnavailable
from ..validation import Problem, body_missing, validate_json_body
from ..wire import is_identifier

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- auth --------------------------------------------------------------------------


def key_matches(presented: str, key: str) -> bool:
    """Constant-time comparison of the whole header value; non-ASCII never matches."""
    try:
        return hmac.compare_digest(presented.encode("ascii"), f"Bearer {key}".encode("ascii"))
    except UnicodeEncodeError:
        return False


def require_key(request: web.Request, header_names: tuple[str, ...], key: str) -> None:
    presented = next((request.headers[name] for name in header_names if name in request.headers), None)
    if presented is None or not key_matches(presented, key):
        raise AuthRejected({"error": "Unauthorized"})


class Access(enum.Enum):
    """Who may call an admin route. Every admin route states one; there is no default."""

    MASTER_KEY = "master key"
    UI_ACCESS_KEY = "UI access key"
    # The dashboard page: it holds no data; the key is typed into it and sent by its script.
    PUBLIC = "public"


def require_access(request: web.Request, access: Access) -> None:
    settings = request.config_dict[keys.SETTINGS]
    match access:
        case Access.MASTER_KEY:
            require_key(request, MASTER_KEY_HEADERS, settings.upstream.master_key)
        case Access.UI_ACCESS_KEY:
            require_key(request, UI_ACCESS_KEY_HEADERS, settings.auth.ui_access_key)
        case Access.PUBLIC:
            pass


# -- validation (the reference's 422 list shape) ------------------------------------

async def _service_type_body(request: web.Request) -> str:
    raw = await request.read()
    if not raw.strip():
        raise RequestInvalid([body_missing()])
    problems: list[Problem] = []
    body = validate_json_body(BudgetUpdate, raw, problems)
    if body is None:
        raise RequestInvalid(problems)
    return body.service_type


# -- handlers ----------------------------------------------------------------------


async def list_users(request: web.Request) -> web.Response:
    problems: list[Problem] = []
    page = parse_query(UsersPage, request.query, problems)
    if page is None:
        raise RequestInvalid(problems)
    limit, offset = page.limit, page.offset
    try:
        users, total = await request.config_dict[keys.STORE].list_users(limit, offset)
    except StoreUnavailable:
        raise ServerFault({"error": "Error listing users"}) from None
    return web.json_response({"users": users, "total": total, "limit": limit, "offset": offset})


async def counts_by_service_type(request: web.Request) -> web.Response:
    try:
        counts = await request.config_dict[keys.STORE].counts_by_service_type()
    except StoreUnavailable:
        raise ServerFault({"error": "Error counting users by service type"}) from None
    return web.json_response({"service_type_counts": counts, "total_users": sum(counts.values())})


COUNTED_AT_ADMISSION = "at_each_admission"
COUNTED_AT_START_UP = "at_start_up"


async def signup_cap_status(request: web.Request) -> web.Response:
    cap = request.config_dict[keys.SETTINGS].signup_cap
    try:
        state = await request.config_dict[keys.STORE].capacity_state()
    except StoreUnavailable:
        raise ServerFault({"error": "Error reading signup cap state"}) from None
    body: dict[str, Any] = {
        "enforce_signin_cap": cap.enforce,
        "capped_service_types": sorted(cap.capped_service_types),
        # When current_managed_identities is current (beyond the reference): each admission
        # counts a new identity only while the cap is enforced; otherwise the count is the
        # one each process start reconciles from LiteLLM's table (at capacity_updated_at).
        "managed_identities_counted": COUNTED_AT_ADMISSION if cap.enforce else COUNTED_AT_START_UP,
    }
    if state is None:
        body |= {
            "max_signed_in_users": cap.max_signed_in_users,
            "current_managed_identities": None,
            "slots_remaining": None,
            "capacity_updated_at": None,
            "capacity_row_missing": True,
        }
    else:
        body |= {
            "max_signed_in_users": state.max_identities,
            "current_managed_identities": state.current_identities,
            "slots_remaining": max(0, state.max_identities - state.current_identities),
            "capacity_updated_at": state.updated_at.isoformat() if state.updated_at else None,
            "capacity_row_missing": False,
        }
    return web.json_response(body)


async def user_info(request: web.Request) -> web.Response:
    """LiteLLM's `/customer/info` for one end user, verbatim (master key, compatibility.md D10)."""
    user_id = request.match_info["user_id"]
    if not user_id.strip() or not is_identifier(user_id):
        raise NotFound("User not found")  # blank, or never issued (wire rules)
    try:
        reply = await request.config_dict[keys.LITELLM].customer_info(user_id)
    except (aiohttp.ClientError, TimeoutError):
        raise ServerFault({"error": "Error fetching user info"}) from None
    if reply.status >= 400:
        raise ApiError({"error": "Error fetching user info"}, status=reply.status)
    try:
        data = json.loads(reply.text)
    except ValueError:
        raise ServerFault({"error": "Error fetching user info"}) from None
    if not data:
        raise NotFound("User not found")
    return web.json_response(data)


async def set_budget(request: web.Request) -> web.Response:
    user_id = request.match_info["user_id"]
    name = await _service_type_body(request)
    catalog = request.config_dict[keys.SETTINGS].catalog
    if name not in catalog:
        raise ApiError(
            {"error": f"Unknown service type: {name}. Valid values: {catalog.service_type_list_text()}"}, status=422
        )
    service_type = name
    budget_id = catalog.budgets[service_type].budget_id
    try:
        # An id the wire rules refuse is never stored: the store finds nothing (404).
        user = await request.config_dict[keys.BUDGET_LINKS].set_budget(user_id, service_type)
    except StoreUnavailable:  # its cause is logged where it happened
        raise ServerFault({"error": "Error updating user budget"}) from None
    if user is None:
        raise NotFound("User not found.")
    return web.json_response({"user_id": user_id, "budget_id": budget_id, "service_type": service_type})


def _set_blocked(blocked: bool) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        try:
            # An id the wire rules refuse is never stored: the store finds nothing (404).
            user: EndUser | None = await request.config_dict[keys.STORE].set_blocked(
                request.match_info["user_id"], blocked
            )
        except StoreUnavailable:
            raise ServerFault({"error": "Error updating user"}) from None
        if user is None:
            raise NotFound("User not found.")
        return web.json_response(dict(user.record))

    handler.__name__ = "block_user" if blocked else "unblock_user"
    return handler


# -- the dashboard -----------------------------------------------------------------


def _admin_page() -> Handler:
    html = (importlib.resources.files(__package__) / "static" / "admin.html").read_text(encoding="utf-8")
    # The page's only script is inline: allow exactly that script, nothing from elsewhere.
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode("utf-8")).digest()).decode("ascii") + "'"
        for s in scripts
    )
    headers = {
        hdrs.CACHE_CONTROL: "no-store",
        CONTENT_SECURITY_POLICY: (
            f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
        "Referrer-Policy": "no-referrer",
    }

    async def admin_page(request: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html", charset="utf-8", headers=headers)

    return admin_page


# -- registration: every route with its declared access level ------------------------


@dataclass(frozen=True)
class AdminRoute:
    method: str
    path: str  # below the mount prefix; "" is the prefix itself
    handler: Handler
    access: Access


USER_PREFIX = "/user"
PAGE_PREFIX = "/admin"


def user_api_routes() -> tuple[AdminRoute, ...]:
    # Fixed paths come before `/{user_id}`, which would otherwise match them.
    return (
        AdminRoute("GET", "", list_users, Access.MASTER_KEY),
        AdminRoute("GET", "/counts-by-service-type", counts_by_service_type, Access.UI_ACCESS_KEY),
        AdminRoute("GET", "/signup-cap-status", signup_cap_status, Access.UI_ACCESS_KEY),
        AdminRoute("GET", "/{user_id}", user_info, Access.MASTER_KEY),
        AdminRoute("POST", "/{user_id}/budget", set_budget, Access.MASTER_KEY),
        AdminRoute("POST", "/{user_id}/block", _set_blocked(True), Access.MASTER_KEY),
        AdminRoute("POST", "/{user_id}/unblock", _set_blocked(False), Access.MASTER_KEY),
    )


def admin_page_routes() -> tuple[AdminRoute, ...]:
    page = _admin_page()
    return (AdminRoute("GET", "", page, Access.PUBLIC), AdminRoute("GET", "/", page, Access.PUBLIC))


DECLARED_ACCESS = web.AppKey("declared_access", dict[web.AbstractRoute, Access])


@web.middleware
async def check_declared_access(request: web.Request, handler: Handler) -> web.StreamResponse:
    match_info = request.match_info
    # No route matched below the prefix: the 404 or 405 goes out as it would anywhere.
    if match_info.http_exception is None:
        # `request.app` is the sub-application here, so this is its own table.
        access = request.app[DECLARED_ACCESS].get(match_info.route)
        if access is None:
            # The startup check refuses such a route; should one get here anyway, it is
            # refused rather than served.
            raise AuthRejected({"error": "Unauthorized"})
        require_access(request, access)
    return await handler(request)


def declared_access_app(routes: Iterable[AdminRoute]) -> web.Application:
    """A sub-application serving `routes`, each behind its declared access level."""
    app = web.Application(middlewares=[check_declared_access])
    declared: dict[web.AbstractRoute, Access] = {}
    for route in routes:
        resource = app.router.add_resource(route.path)
        # GET also answers HEAD, as `add_get` does, under the same access level.
        methods = ("GET", "HEAD") if route.method == "GET" else (route.method,)
        for method in methods:
            declared[resource.add_route(method, route.handler)] = route.access
    app[DECLARED_ACCESS] = declared
    return app


class UndeclaredAdminAccess(RuntimeError):
    """A route under an admin prefix without a declared access level: the app must not start."""


def _is_under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def undeclared_admin_routes(app: web.Application) -> list[str]:
    """`METHOD path` of every route under an admin prefix that no access table covers."""
    found = []
    for resource in app.router.resources():
        if not any(_is_under(resource.canonical, prefix) for prefix in (USER_PREFIX, PAGE_PREFIX)):
            continue
        # A declared sub-application carries its table; anything else has none.
        mounted = resource.get_info().get("app")
        declared = mounted.get(DECLARED_ACCESS, {}) if isinstance(mounted, web.Application) else {}
        for route in resource:
            if route not in declared:
                path = route.resource.canonical if route.resource is not None else resource.canonical
                found.append(f"{route.method} {path}")
    return found


async def refuse_undeclared_admin_routes(app: web.Application) -> None:
    undeclared = undeclared_admin_routes(app)
    if undeclared:
        raise UndeclaredAdminAccess("admin routes without a declared access level: " + ", ".join(undeclared))


def setup_admin_routes(app: web.Application) -> None:
    """Mount `/user/*` and `/admin`, and refuse to start with an undeclared admin route."""
    app.add_subapp(USER_PREFIX, declared_access_app(user_api_routes()))
    app.add_subapp(PAGE_PREFIX, declared_access_app(admin_page_routes()))
    # First of all startup steps: a refusal then leaves nothing opened to close.
    app.on_startup.insert(0, refuse_undeclared_admin_routes)
