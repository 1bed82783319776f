"""Health probes over real HTTP (compatibility.md §1.2, D6, D64): liveness never does I/O;
readiness reports every dependency, each check bounded by READINESS_CHECK_TIMEOUT_S, and its
status code is 200 while this pod can serve; a dependency down makes it 503 only with
READINESS_REQUIRES_DEPENDENCIES=true (the reference's behaviour). The degraded cases run both ways."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator

import pytest
from aiohttp import web

from mlpa_aiohttp import __version__, keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.routes.health import MEMORY_STORE_STATE

from ..conftest import Service, ServiceFactory, make_settings

READY_LITELLM = {"status": "healthy", "db": "connected"}


class ControllableStore:
    """The app's real store, with a database ping the test controls (it stands in for the
    PostgreSQL store, so readiness reports its databases)."""

    backend = "postgres"

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.ping_result = {"postgres": True, "app_attest": True}
        self.ping_delay = 0.0
        self.ping_error: Exception | None = None
        # A ping waits for this too when set (a test orders events with it), and counts.
        self.ping_gate: asyncio.Event | None = None
        self.pings_started = 0
        self.pinging = False

    async def ping(self) -> dict[str, bool]:
        self.pings_started += 1
        self.pinging = True
        try:
            await asyncio.sleep(self.ping_delay)
            if self.ping_gate is not None:
                await self.ping_gate.wait()
        finally:
            self.pinging = False
        if self.ping_error is not None:
            raise self.ping_error
        return dict(self.ping_result)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture
async def service_with_store(aiohttp_client, fake_litellm_server, fake_fxa_server):
    """A service whose store ping the test controls; returns (service, store)."""
    litellm, litellm_server = fake_litellm_server
    fxa, fxa_server = fake_fxa_server

    async def build(**env: str) -> tuple[Service, ControllableStore]:
        settings = make_settings(
            str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")), **env
        )
        app = create_app(settings)
        holder: dict[str, ControllableStore] = {}

        async def wrap_store(app: web.Application) -> AsyncIterator[None]:
            holder["store"] = ControllableStore(app[keys.STORE])
            app[keys.STORE] = holder["store"]
            yield

        app.cleanup_ctx.append(wrap_store)
        client = await aiohttp_client(app)
        return Service(client=client, litellm=litellm, fxa=fxa, app=app), holder["store"]

    return build


@dataclass(frozen=True)
class DependencyRule:
    env: dict[str, str]
    # Readiness's status code while a dependency is down (the body says "degraded" either way).
    status_when_a_dependency_is_down: int


@pytest.fixture(
    params=[
        DependencyRule({}, 200),  # the default: this pod's own health decides (D64)
        DependencyRule({"READINESS_REQUIRES_DEPENDENCIES": "true"}, 503),  # the reference's rule
    ],
    ids=["own-health", "requires-dependencies"],
)
def rule(request: pytest.FixtureRequest) -> DependencyRule:
    return request.param


async def readiness(service: Service) -> tuple[int, dict[str, Any]]:
    response = await service.client.get("/health/readiness")
    return response.status, await response.json()


# -- liveness -------------------------------------------------------------------------


async def test_liveness_is_alive(service: Service) -> None:
    response = await service.client.get("/health/liveness")
    assert response.status == 200
    assert await response.json() == {"status": "alive"}


async def test_liveness_does_no_io_even_when_every_dependency_is_down(service_with_store) -> None:
    service, store = await service_with_store()
    service.litellm.readiness_down = True
    service.litellm.readiness_delay = 5.0
    store.ping_error = ConnectionRefusedError("database down")
    before = len(service.litellm.requests)
    response = await service.client.get("/health/liveness")
    assert response.status == 200
    assert await response.json() == {"status": "alive"}
    assert len(service.litellm.requests) == before, "liveness must not call LiteLLM"
    assert store.pings_started == 0, "liveness must not ping the databases"


# -- readiness: the ready case ----------------------------------------------------------


async def test_readiness_connected_when_everything_is_ready(service: Service) -> None:
    service.litellm.litellm_version = "1.99.0"
    service.litellm.readiness_body = dict(READY_LITELLM)
    status, body = await readiness(service)
    assert status == 200
    assert body == {
        "status": "connected",
        "mlpa_version": __version__,
        # The plain `service` keeps its users in memory: no database to report on.
        "pg_server_dbs": {"postgres": MEMORY_STORE_STATE, "app_attest": MEMORY_STORE_STATE},
        # The version comes from /public/model_hub/info; LiteLLM's readiness JSON follows it.
        "litellm": {"version": "1.99.0", "status": "healthy", "db": "connected"},
        "privacy_filter": {"status": "disabled"},
    }
    readiness_calls = service.litellm.requests_to("/health/readiness")
    assert readiness_calls and readiness_calls[-1].headers["authorization"] == "Bearer sk-test-master"
    assert service.litellm.requests_to("/public/model_hub/info")


@pytest.mark.parametrize("litellm_status", ["healthy", "connected"])
async def test_readiness_accepts_both_healthy_litellm_statuses(service: Service, litellm_status: str) -> None:
    service.litellm.readiness_status = litellm_status
    status, body = await readiness(service)
    assert status == 200
    assert body["status"] == "connected"
    assert body["litellm"]["status"] == litellm_status


async def test_litellm_version_in_its_own_readiness_body_wins(service: Service) -> None:
    # The reference merges LiteLLM's JSON after its own field (compatibility.md §11.29).
    service.litellm.litellm_version = "1.2.3"
    service.litellm.readiness_body = {**READY_LITELLM, "version": "9.9.9"}
    _, body = await readiness(service)
    assert body["litellm"]["version"] == "9.9.9"


async def test_litellms_own_litellm_version_key_passes_through_beside_ours(service: Service) -> None:
    # 1.0.39 writes `version`; `litellm_version` appears only because LiteLLM's JSON carries it.
    service.litellm.litellm_version = "1.2.3"
    service.litellm.readiness_body = {**READY_LITELLM, "litellm_version": "1.2.3-from-readiness"}
    _, body = await readiness(service)
    assert body["litellm"] == {"version": "1.2.3", **READY_LITELLM, "litellm_version": "1.2.3-from-readiness"}


async def test_litellm_version_read_under_either_model_hub_key(service: Service) -> None:
    service.litellm.model_hub_version_key = "version"
    service.litellm.litellm_version = "1.200.0"
    _, body = await readiness(service)
    assert body["litellm"]["version"] == "1.200.0"


async def test_litellm_version_is_remembered_once_known(service: Service) -> None:
    await readiness(service)
    await readiness(service)
    assert len(service.litellm.requests_to("/public/model_hub/info")) == 1


# -- readiness: degraded ------------------------------------------------------------------


@pytest.mark.parametrize(
    "litellm_body",
    [
        {"status": "healthy", "db": "Not connected"},
        {"status": "unhealthy", "db": "connected"},
        {"status": "healthy"},
    ],
)
async def test_litellm_not_ready_is_degraded_with_its_body(
    make_service: ServiceFactory, rule: DependencyRule, litellm_body: dict
) -> None:
    service = await make_service(**rule.env)
    service.litellm.readiness_body = litellm_body
    status, body = await readiness(service)
    assert status == rule.status_when_a_dependency_is_down
    assert body["status"] == "degraded"
    assert body["pg_server_dbs"] == {"postgres": MEMORY_STORE_STATE, "app_attest": MEMORY_STORE_STATE}
    assert body["litellm"] == {"version": service.litellm.litellm_version, **litellm_body}


async def test_litellm_error_status_is_unreachable(make_service: ServiceFactory, rule: DependencyRule) -> None:
    service = await make_service(**rule.env)
    service.litellm.readiness_down = True
    status, body = await readiness(service)
    assert status == rule.status_when_a_dependency_is_down
    assert body["status"] == "degraded"
    assert body["litellm"] == {"version": service.litellm.litellm_version, "status": "unreachable"}


async def test_slow_litellm_is_unreachable_within_the_bound(service_with_store, rule: DependencyRule) -> None:
    service, _ = await service_with_store(READINESS_CHECK_TIMEOUT_S="0.3", **rule.env)
    service.litellm.readiness_delay = 5.0
    status, body = await readiness(service)
    # LiteLLM would answer "healthy" after 5 s: "unreachable" is the bound cutting it short.
    assert status == rule.status_when_a_dependency_is_down
    assert body["litellm"]["status"] == "unreachable"
    assert body["pg_server_dbs"] == {"postgres": "connected", "app_attest": "connected"}


async def test_unreachable_litellm_is_degraded_and_version_unknown(
    make_service: ServiceFactory, rule: DependencyRule
) -> None:
    service = await make_service(LITELLM_API_BASE="http://127.0.0.1:9", **rule.env)
    status, body = await readiness(service)
    assert status == rule.status_when_a_dependency_is_down
    assert body["litellm"] == {"version": "N/A", "status": "unreachable"}


@pytest.mark.parametrize(
    "ping, expected",
    [
        ({"postgres": False, "app_attest": True}, {"postgres": "offline", "app_attest": "connected"}),
        ({"postgres": True, "app_attest": False}, {"postgres": "connected", "app_attest": "offline"}),
    ],
)
async def test_a_database_down_is_degraded(service_with_store, rule: DependencyRule, ping: dict, expected: dict) -> None:
    service, store = await service_with_store(**rule.env)
    store.ping_result = ping
    status, body = await readiness(service)
    assert status == rule.status_when_a_dependency_is_down
    assert body["status"] == "degraded"
    assert body["pg_server_dbs"] == expected
    # LiteLLM's check is independent of the databases'.
    assert body["litellm"]["status"] == "healthy"


async def test_a_failing_database_ping_is_offline_not_an_error(service_with_store, rule: DependencyRule) -> None:
    service, store = await service_with_store(**rule.env)
    store.ping_error = OSError("connection refused")
    status, body = await readiness(service)
    assert status == rule.status_when_a_dependency_is_down
    assert body["pg_server_dbs"] == {"postgres": "offline", "app_attest": "offline"}


async def test_slow_database_ping_is_bounded(service_with_store, rule: DependencyRule) -> None:
    service, store = await service_with_store(READINESS_CHECK_TIMEOUT_S="0.3", **rule.env)
    store.ping_delay = 5.0
    status, body = await readiness(service)
    # The ping would succeed after 5 s: "offline" is the bound cutting it short.
    assert status == rule.status_when_a_dependency_is_down
    assert body["pg_server_dbs"] == {"postgres": "offline", "app_attest": "offline"}
    assert body["litellm"]["status"] == "healthy"


async def test_checks_run_concurrently(service_with_store) -> None:
    """The database ping can only finish once LiteLLM has been asked, and LiteLLM must be
    asked while the ping is still running: one check after the other fails either way."""
    service, store = await service_with_store(READINESS_CHECK_TIMEOUT_S="2")
    store.ping_gate = asyncio.Event()
    pinging_when_litellm_was_asked: list[bool] = []

    async def open_the_gate_when_litellm_is_asked() -> None:
        while not service.litellm.requests_to("/health/readiness"):
            await asyncio.sleep(0.005)
        pinging_when_litellm_was_asked.append(store.pinging)
        store.ping_gate.set()

    watcher = asyncio.ensure_future(open_the_gate_when_litellm_is_asked())
    try:
        status, body = await readiness(service)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    assert status == 200, body
    assert pinging_when_litellm_was_asked == [True]


async def test_readiness_turns_503_as_soon_as_shutdown_begins(service: Service) -> None:
    status, _ = await readiness(service)
    assert status == 200
    await service.app[keys.STREAMS].shutdown(0)
    status, body = await readiness(service)
    assert status == 503
    assert body["status"] == "degraded"
