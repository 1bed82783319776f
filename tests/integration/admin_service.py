"""The admin API's test harness, shared by the route tests and the admin page's browser
test: the service's own app with the admin keys, on either store, a loopback LiteLLM
`/customer/info`, and a way to seed the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.catalog import ServiceType
from mlpa_aiohttp.settings import AuthSettings, PostgresSettings, Settings, SignupCapSettings, UpstreamSettings
from mlpa_aiohttp.store.base import UserStore
from mlpa_aiohttp.store.memory import MemoryUserStore
from mlpa_aiohttp.store.pools import Pools
from tests.support.store_seeding import add_memory_row

from .conftest import insert_user

MASTER_KEY = "sk-master-test"
UI_KEY = "sk-ui-test"
MASTER = {"master_key": f"Bearer {MASTER_KEY}"}
UI = {"mlpa_ui_access_key": f"Bearer {UI_KEY}"}
UNAUTHORIZED = {"detail": {"error": "Unauthorized"}}
CAPPED = frozenset({ServiceType.AI, ServiceType.MEMORIES})

ClientFactory = Callable[..., Awaitable[TestClient]]
ServerFactory = Callable[..., Awaitable[TestServer]]


def admin_settings(
    api_base: str, *, store: str = "memory", postgres: PostgresSettings | None = None, enforce: bool = True
) -> Settings:
    return Settings(
        upstream=UpstreamSettings(api_base=api_base, master_key=MASTER_KEY),
        auth=AuthSettings(ui_access_key=UI_KEY),
        signup_cap=SignupCapSettings(enforce=enforce, max_signed_in_users=500, capped_service_types=CAPPED),
        store=store,
        postgres=postgres if postgres is not None else PostgresSettings(),
    )


async def fake_customer_info(request: web.Request) -> web.Response:
    """LiteLLM's `/customer/info`, reduced to the cases the route distinguishes."""
    if request.headers.get("Authorization") != f"Bearer {MASTER_KEY}":
        return web.json_response({"error": "auth"}, status=401)
    user_id = request.query["end_user_id"]
    if user_id == "explodes:ai":
        return web.json_response({"error": "boom"}, status=500)
    if user_id == "gone:ai":
        return web.json_response({"error": "nope"}, status=404)
    if user_id == "empty:ai":
        return web.json_response({})
    if user_id.startswith("unknown"):
        # LiteLLM 1.106.12's answer for an end user it does not have (a ProxyException).
        error = {"message": f"End User Id={user_id} does not exist in db", "type": "not_found", "param": "end_user_id", "code": "404"}
        return web.json_response({"error": error}, status=404)
    return web.json_response({"user_id": user_id, "spend": 0.25, "blocked": False, "litellm_budget_table": None})


@dataclass
class AdminService:
    """The service under test, its own store, and the test-only way to seed that store."""

    client: TestClient
    store: UserStore
    add_user: Callable[..., Awaitable[None]]


async def start_admin_service(
    aiohttp_client: ClientFactory, api_base: str, *, pools: Pools | None, pg_settings: PostgresSettings | None, **options: Any
) -> AdminService:
    """The service on the memory store, or on PostgreSQL when given `pools` (emptied by
    their fixture before the app starts; the app seeds budgets and the capacity row at
    startup, as in production)."""
    store_kind = "memory" if pools is None else "postgres"
    app = create_app(admin_settings(api_base, store=store_kind, postgres=pg_settings, **options))
    client = await aiohttp_client(app)
    store = app[keys.STORE]

    async def add_user(user_id: str, budget_id: str | None = None, *, blocked: bool = False) -> None:
        if pools is not None:
            await insert_user(pools.litellm, user_id, budget_id, blocked=blocked)
        else:
            assert isinstance(store, MemoryUserStore)
            add_memory_row(store, user_id, budget_id, blocked=blocked)

    return AdminService(client, store, add_user)


AdminServiceFactory = Callable[..., Awaitable[AdminService]]
