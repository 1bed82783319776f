"""The admin API over real HTTP, through the service's own app (`create_app(settings)`, so
production's middlewares and error mapping answer), on both stores (and a loopback LiteLLM
for `/customer/info`). Exact bodies and statuses per compatibility.md §1.6, D10 and D12."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.catalog import BUILTIN_CATALOG
from mlpa_aiohttp.routes.admin import UndeclaredAdminAccess, declared_access_app
from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.store.pools import Pools
from tests.support.postgres import ThrowawayPostgres

from .admin_service import (
    CAPPED,
    MASTER,
    MASTER_KEY,
    UI,
    UI_KEY,
    UNAUTHORIZED,
    AdminService,
    AdminServiceFactory,
    ClientFactory,
    ServerFactory,
    admin_settings,
    fake_customer_info,
    start_admin_service,
)

pytestmark = pytest.mark.postgres

@pytest.fixture
async def litellm(aiohttp_server: ServerFactory) -> TestServer:
    app = web.Application()
    app.router.add_get("/customer/info", fake_customer_info)
    return await aiohttp_server(app)


@pytest.fixture(params=["memory", "postgres"])
def make_admin_service(request: pytest.FixtureRequest, aiohttp_client: ClientFactory) -> AdminServiceFactory:
    """`await make_admin_service(api_base, **settings_options)`, once per store kind."""
    on_postgres = request.param == "postgres"
    pools: Pools | None = request.getfixturevalue("pools") if on_postgres else None
    pg_settings: PostgresSettings | None = request.getfixturevalue("pg_settings") if on_postgres else None

    async def build(api_base: str, **options: Any) -> AdminService:
        return await start_admin_service(aiohttp_client, api_base, pools=pools, pg_settings=pg_settings, **options)

    return build


@pytest.fixture
async def service(make_admin_service: AdminServiceFactory, litellm: TestServer) -> AdminService:
    return await make_admin_service(str(litellm.make_url("")))


@pytest.fixture
def client(service: AdminService) -> TestClient:
    return service.client


async def expect(response: aiohttp.ClientResponse, status: int, body: Any) -> None:
    assert response.status == status, await response.text()
    assert await response.json() == body


# -- auth --------------------------------------------------------------------------

MASTER_ROUTES = [
    ("GET", "/user"),
    ("GET", "/user/someone:ai"),
    ("POST", "/user/someone:ai/budget"),
    ("POST", "/user/someone:ai/block"),
    ("POST", "/user/someone:ai/unblock"),
]
UI_ROUTES = [("GET", "/user/counts-by-service-type"), ("GET", "/user/signup-cap-status")]
PUBLIC_ROUTES = [("GET", "/admin"), ("GET", "/admin/")]


def admin_route_templates(app: web.Application) -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves under `/user` and `/admin`."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith(("/user", "/admin"))
    }


def test_the_auth_tests_cover_every_admin_route() -> None:
    """A new admin route must join MASTER_ROUTES, UI_ROUTES or PUBLIC_ROUTES (and so the
    401 test below), or this fails."""
    listed = {
        (method, path.replace("someone:ai", "{user_id}")) for method, path in MASTER_ROUTES + UI_ROUTES + PUBLIC_ROUTES
    }
    listed |= {("HEAD", path) for method, path in listed if method == "GET"}
    app = create_app(admin_settings("http://127.0.0.1:9"))
    assert admin_route_templates(app) == listed


@pytest.mark.parametrize("method,path", MASTER_ROUTES + UI_ROUTES)
async def test_missing_or_wrong_key_is_401(client: TestClient, method: str, path: str) -> None:
    ui_route = (method, path) in UI_ROUTES
    right_name = "mlpa_ui_access_key" if ui_route else "master_key"
    other_key = MASTER if ui_route else UI  # the keys are not interchangeable
    cases: list[dict[str, str]] = [
        {},
        {right_name: "Bearer not-the-key"},
        {right_name: UI_KEY if ui_route else MASTER_KEY},  # no "Bearer " prefix
        other_key,
        {right_name: f"Bearer {MASTER_KEY if ui_route else UI_KEY}"},
    ]
    for headers in cases:
        await expect(await client.request(method, path, headers=headers, json={}), 401, UNAUTHORIZED)
    if method == "GET":  # its HEAD twin is held to the same key
        assert (await client.head(path)).status == 401


async def test_the_key_is_checked_before_the_request_is_read(client: TestClient) -> None:
    """Auth comes first: a request that is wrong in every other way is still only 401."""
    await expect(await client.get("/user", params={"limit": "0"}), 401, UNAUTHORIZED)
    await expect(await client.get("/user/%20"), 401, UNAUTHORIZED)
    response = await client.post("/user/u:ai/budget", data=b"{not json", headers={"Content-Type": "application/json"})
    await expect(response, 401, UNAUTHORIZED)


async def test_unmatched_admin_paths_keep_their_404_and_405(client: TestClient) -> None:
    await expect(await client.get("/user/a/b/c"), 404, {"detail": "Not Found"})
    response = await client.delete("/user", headers=MASTER)
    assert response.status == 405 and set(response.headers["Allow"].split(",")) == {"GET", "HEAD"}


async def test_non_ascii_key_is_401(client: TestClient) -> None:
    response = await client.get("/user", headers={"master_key": "Bearer sk-mäster".encode().decode("latin-1")})
    await expect(response, 401, UNAUTHORIZED)


async def test_hyphenated_header_names_work(client: TestClient) -> None:
    assert (await client.get("/user", headers={"master-key": f"Bearer {MASTER_KEY}"})).status == 200
    response = await client.get("/user/counts-by-service-type", headers={"mlpa-ui-access-key": f"Bearer {UI_KEY}"})
    assert response.status == 200


async def never_served(request: web.Request) -> web.Response:
    raise AssertionError("an undeclared admin route was served")


async def refuses_to_start(app: web.Application) -> str:
    """What `AppRunner.setup()` (run by gunicorn's worker and the test server alike) raises."""
    runner = web.AppRunner(app)
    with pytest.raises(UndeclaredAdminAccess) as refusal:
        await runner.setup()
    return str(refusal.value)


async def test_a_root_route_under_user_without_a_declared_level_stops_startup() -> None:
    app = create_app(admin_settings("http://127.0.0.1:9"))
    app.router.add_get("/user/{user_id}/export", never_served)  # straight onto the router: no level
    message = await refuses_to_start(app)
    assert "GET /user/{user_id}/export" in message and "HEAD /user/{user_id}/export" in message


async def test_a_sub_app_route_without_a_declared_level_stops_startup() -> None:
    app = create_app(admin_settings("http://127.0.0.1:9"))
    reports = declared_access_app([])
    reports.router.add_post("/daily", never_served)  # beside the table, not through it
    app.add_subapp("/admin/reports", reports)
    assert (await refuses_to_start(app)).endswith("level: POST /admin/reports/daily")


async def test_a_route_beside_the_table_is_refused_wherever_it_is_mounted(aiohttp_client: ClientFactory) -> None:
    """Outside `/user` and `/admin` the startup check does not look; the middleware of a
    declared sub-app still refuses any route its table does not name, whatever the key."""
    app = create_app(admin_settings("http://127.0.0.1:9"))
    reports = declared_access_app([])
    reports.router.add_get("/daily", never_served)
    app.add_subapp("/reports", reports)
    client = await aiohttp_client(app)
    for headers in ({}, MASTER, UI):
        await expect(await client.get("/reports/daily", headers=headers), 401, UNAUTHORIZED)


async def test_the_declared_app_starts(aiohttp_client: ClientFactory) -> None:
    """The control for the two above: unchanged, the service starts and serves its page."""
    client = await aiohttp_client(create_app(admin_settings("http://127.0.0.1:9")))
    assert (await client.get("/admin")).status == 200


# -- list and counts ---------------------------------------------------------------


async def test_list_users_pages(client: TestClient, service: AdminService) -> None:
    for user_id in ("c:ai", "a:ai", "b:s2s"):
        await service.add_user(user_id, "end-user-budget-ai")
    response = await client.get("/user", headers=MASTER)
    assert response.status == 200
    body = await response.json()
    assert (body["total"], body["limit"], body["offset"]) == (3, 50, 0)
    assert [u["user_id"] for u in body["users"]] == ["a:ai", "b:s2s", "c:ai"]
    assert {"user_id": "a:ai", "budget_id": "end-user-budget-ai", "blocked": False}.items() <= body["users"][0].items()
    body = await (await client.get("/user", params={"limit": "1", "offset": "2"}, headers=MASTER)).json()
    assert [u["user_id"] for u in body["users"]] == ["c:ai"] and (body["limit"], body["offset"]) == (1, 2)
    body = await (await client.get("/user", params={"limit": "200"}, headers=MASTER)).json()
    assert body["limit"] == 200


@pytest.mark.parametrize(
    "params,errors",
    [
        ({"limit": "0"}, [(["query", "limit"], "Input should be greater than or equal to 1", "greater_than_equal")]),
        ({"limit": "201"}, [(["query", "limit"], "Input should be less than or equal to 200", "less_than_equal")]),
        ({"offset": "-1"}, [(["query", "offset"], "Input should be greater than or equal to 0", "greater_than_equal")]),
        (
            {"limit": "ten", "offset": "x"},
            [
                (["query", "limit"], "Input should be a valid integer, unable to parse string as an integer", "int_parsing"),
                (["query", "offset"], "Input should be a valid integer, unable to parse string as an integer", "int_parsing"),
            ],
        ),
    ],
)
async def test_list_users_rejects_bad_paging(client: TestClient, params: dict[str, str], errors: list[tuple[Any, ...]]) -> None:
    expected = {"detail": [{"loc": loc, "msg": msg, "type": type_} for loc, msg, type_ in errors]}
    await expect(await client.get("/user", params=params, headers=MASTER), 422, expected)


async def test_counts_by_service_type(client: TestClient, service: AdminService) -> None:
    for user_id in ("a:ai", "b:ai", "a:memories", "no-colon"):
        await service.add_user(user_id)
    await expect(
        await client.get("/user/counts-by-service-type", headers=UI),
        200,
        {"service_type_counts": {"ai": 2, "memories": 1}, "total_users": 3},
    )


async def signup_cap_status(client: TestClient) -> dict:
    """The status body without its timestamp, after checking the timestamp is a date."""
    body = await (await client.get("/user/signup-cap-status", headers=UI)).json()
    updated_at = body.pop("capacity_updated_at")
    assert isinstance(updated_at, str) and updated_at[:2] == "20"
    return body


async def test_signup_cap_status(client: TestClient, service: AdminService) -> None:
    # Startup seeded the row from the settings (500), with no managed identity yet.
    body = await signup_cap_status(client)
    assert body == {
        "enforce_signin_cap": True,
        "capped_service_types": ["ai", "memories"],
        "managed_identities_counted": "at_each_admission",
        "max_signed_in_users": 500,
        "current_managed_identities": 0,
        "slots_remaining": 500,
        "capacity_row_missing": False,
    }
    await service.add_user("a:ai")
    await service.store.ensure_capacity_state(2, CAPPED)
    await service.store.admit("b")
    body = await signup_cap_status(client)
    assert body == {
        "enforce_signin_cap": True,
        "capped_service_types": ["ai", "memories"],
        "managed_identities_counted": "at_each_admission",
        "max_signed_in_users": 2,
        "current_managed_identities": 2,
        "slots_remaining": 0,
        "capacity_row_missing": False,
    }


async def test_signup_cap_status_without_the_capacity_row(
    pools: Pools, pg_settings: PostgresSettings, litellm: TestServer, aiohttp_client: ClientFactory
) -> None:
    """Only PostgreSQL can lose the row after startup (the memory store always has it)."""
    service = await start_admin_service(aiohttp_client, str(litellm.make_url("")), pools=pools, pg_settings=pg_settings)
    await pools.app.execute("DELETE FROM mlpa_user_capacity")
    await expect(
        await service.client.get("/user/signup-cap-status", headers=UI),
        200,
        {
            "enforce_signin_cap": True,
            "capped_service_types": ["ai", "memories"],
            "managed_identities_counted": "at_each_admission",
            "max_signed_in_users": 500,
            "current_managed_identities": None,
            "slots_remaining": None,
            "capacity_updated_at": None,
            "capacity_row_missing": True,
        },
    )


# -- lookup (proxied to LiteLLM) ----------------------------------------------------


async def test_user_info_is_proxied_verbatim(client: TestClient) -> None:
    await expect(
        await client.get("/user/someone:ai", headers=MASTER),
        200,
        {"user_id": "someone:ai", "spend": 0.25, "blocked": False, "litellm_budget_table": None},
    )
    # LiteLLM's 404 for an unknown end user is an upstream HTTP error: that status, the route's body.
    await expect(await client.get("/user/unknown:ai", headers=MASTER), 404, {"detail": {"error": "Error fetching user info"}})


async def test_user_info_failures(client: TestClient) -> None:
    error = {"detail": {"error": "Error fetching user info"}}
    await expect(await client.get("/user/explodes:ai", headers=MASTER), 500, error)
    await expect(await client.get("/user/gone:ai", headers=MASTER), 404, error)
    await expect(await client.get("/user/empty:ai", headers=MASTER), 404, {"detail": "User not found"})
    await expect(await client.get("/user/%20", headers=MASTER), 404, {"detail": "User not found"})
    assert (await client.get("/user/", headers=MASTER)).status in (404, 422)


async def test_user_info_with_litellm_unreachable(make_admin_service: AdminServiceFactory) -> None:
    client = (await make_admin_service("http://127.0.0.1:1")).client
    await expect(await client.get("/user/x:ai", headers=MASTER), 500, {"detail": {"error": "Error fetching user info"}})


# -- writes ------------------------------------------------------------------------


async def test_set_budget(client: TestClient, service: AdminService) -> None:
    await service.add_user("u:ai", "end-user-budget-ai")
    await expect(
        await client.post("/user/u:ai/budget", json={"service_type": "search-dev"}, headers=MASTER),
        200,
        {"user_id": "u:ai", "budget_id": "end-user-budget-search-dev", "service_type": "search-dev"},
    )
    user = await service.store.get_user("u:ai")
    assert user is not None and user.budget_id == "end-user-budget-search-dev"
    await expect(
        await client.post("/user/missing:ai/budget", json={"service_type": "ai"}, headers=MASTER),
        404,
        {"detail": "User not found."},
    )


async def test_set_budget_validation(client: TestClient) -> None:
    await expect(
        await client.post("/user/u:ai/budget", json={"service_type": "gold"}, headers=MASTER),
        422,
        {"detail": {"error": f"Unknown service type: gold. Valid values: {BUILTIN_CATALOG.service_type_list_text()}"}},
    )
    assert BUILTIN_CATALOG.service_type_list_text().startswith("ai, s2s, s2s-android, memories, search")
    cases: list[tuple[bytes, list[Any]]] = [
        (b"", [{"loc": ["body"], "msg": "Field required", "type": "missing"}]),
        (b"{}", [{"loc": ["body", "service_type"], "msg": "Field required", "type": "missing"}]),
        (b'{"service_type": 3}', [{"loc": ["body", "service_type"], "msg": "Input should be a valid string", "type": "string_type"}]),
        (b"{not json", [{"loc": ["body", 1], "msg": "JSON decode error", "type": "json_invalid"}]),
        (
            b"[]",
            [{"loc": ["body"], "msg": "Input should be a valid dictionary or object to extract fields from", "type": "model_attributes_type"}],
        ),
    ]
    for raw, errors in cases:
        response = await client.post(
            "/user/u:ai/budget", data=raw, headers={**MASTER, "Content-Type": "application/json"}
        )
        await expect(response, 422, {"detail": errors})


async def test_block_and_unblock(client: TestClient, service: AdminService) -> None:
    await service.add_user("u:ai", "end-user-budget-ai")
    response = await client.post("/user/u:ai/block", headers=MASTER)
    assert response.status == 200
    row = await response.json()
    assert {"user_id": "u:ai", "budget_id": "end-user-budget-ai", "blocked": True}.items() <= row.items()
    assert "spend" in row and "alias" in row
    row = await (await client.post("/user/u:ai/unblock", headers=MASTER)).json()
    assert row["blocked"] is False
    for action in ("block", "unblock"):
        await expect(await client.post(f"/user/nobody:ai/{action}", headers=MASTER), 404, {"detail": "User not found."})


# -- the database going away -------------------------------------------------------


async def test_database_down_gives_the_reference_500_bodies(
    pg_server: ThrowawayPostgres, pools: Pools, pg_settings: PostgresSettings, litellm: TestServer, aiohttp_client: ClientFactory
) -> None:
    service = await start_admin_service(aiohttp_client, str(litellm.make_url("")), pools=pools, pg_settings=pg_settings)
    client = service.client
    expected = [
        ("GET", "/user", MASTER, None, "Error listing users"),
        ("GET", "/user/counts-by-service-type", UI, None, "Error counting users by service type"),
        ("GET", "/user/signup-cap-status", UI, None, "Error reading signup cap state"),
        ("POST", "/user/u:ai/budget", MASTER, {"service_type": "ai"}, "Error updating user budget"),
        ("POST", "/user/u:ai/block", MASTER, None, "Error updating user"),
        ("POST", "/user/u:ai/unblock", MASTER, None, "Error updating user"),
    ]
    pg_server.stop()
    try:
        for method, path, headers, body, message in expected:
            response = await client.request(method, path, headers=headers, json=body)
            await expect(response, 500, {"detail": {"error": message}})
    finally:
        pg_server.start()
    await expect(await client.get("/user", headers=MASTER), 200, {"users": [], "total": 0, "limit": 50, "offset": 0})


# -- the page ----------------------------------------------------------------------


async def test_admin_page_is_served(client: TestClient) -> None:
    for path in ("/admin", "/admin/"):
        response = await client.get(path)
        assert response.status == 200
        assert response.content_type == "text/html"
        assert "script-src 'sha256-" in response.headers["Content-Security-Policy"]
        text = await response.text()
        assert "UI access key" in text and "https://" not in text  # self-contained, no CDN
