"""Migrations (idempotent, concurrent-safe, Alembic adoption) and pool start-up/outages."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from typing import Awaitable, Callable

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.settings import PostgresSettings, Settings, SignupCapSettings
from mlpa_aiohttp.store.base import StoreUnavailable
from mlpa_aiohttp.__main__ import migrate_command
from mlpa_aiohttp.store.migrate import load_migrations, migrate
from mlpa_aiohttp.store.pools import DatabaseConnectError, Pools, open_pools
from mlpa_aiohttp.store.postgres import PostgresUserStore, record_dict
from tests.support.postgres import ThrowawayPostgres

from .conftest import RecordingCreator

pytestmark = pytest.mark.postgres

ALL_VERSIONS = [m.version for m in load_migrations()]


def fresh_app_db(pg: PostgresSettings, max_users: int = 1000) -> Settings:
    name = f"app_attest_{uuid.uuid4().hex[:10]}"
    return Settings(
        postgres=replace(pg, app_attest_db_name=name),
        signup_cap=SignupCapSettings(max_signed_in_users=max_users),
    )


async def connect(settings: Settings) -> asyncpg.Connection:
    pg = settings.postgres
    return await asyncpg.connect(
        host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=pg.app_attest_db_name
    )


async def test_migrate_creates_database_and_is_idempotent(pg_settings: PostgresSettings) -> None:
    settings = fresh_app_db(pg_settings, max_users=7)
    assert await migrate(settings) == ALL_VERSIONS
    assert await migrate(settings) == []
    conn = await connect(settings)
    try:
        assert [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY 1")] == ALL_VERSIONS
        row = await conn.fetchrow("SELECT max_identities, current_identities FROM mlpa_user_capacity")
        assert tuple(row) == (7, 0)
        columns = {
            r["column_name"]: (r["is_nullable"], r["column_default"])
            for r in await conn.fetch(
                "SELECT column_name, is_nullable, column_default FROM information_schema.columns"
                " WHERE table_name = 'public_keys'"
            )
        }
        assert columns["counter"] == ("NO", None) and columns["updated_at"] == ("NO", None)
        options = await conn.fetchval("SELECT reloptions FROM pg_class WHERE relname = 'mlpa_user_capacity'")
        assert "fillfactor=70" in options
    finally:
        await conn.close()
    # A redeploy with a new cap updates the maximum and keeps the count.
    assert await migrate(replace(settings, signup_cap=SignupCapSettings(max_signed_in_users=9))) == []
    conn = await connect(settings)
    try:
        assert await conn.fetchval("SELECT max_identities FROM mlpa_user_capacity") == 9
    finally:
        await conn.close()


async def test_concurrent_migrate_runs_apply_each_file_once(pg_settings: PostgresSettings) -> None:
    settings = fresh_app_db(pg_settings)
    results = await asyncio.gather(*(migrate(settings) for _ in range(3)))
    assert sorted(v for applied in results for v in applied) == ALL_VERSIONS
    assert await migrate(settings) == []


async def test_migrate_adopts_an_alembic_database(pg_settings: PostgresSettings) -> None:
    settings = fresh_app_db(pg_settings)
    admin = await asyncpg.connect(
        host=pg_settings.host, port=pg_settings.port, user=pg_settings.username,
        password=pg_settings.password, database="postgres",
    )  # fmt: skip
    try:
        await admin.execute(f'CREATE DATABASE "{settings.postgres.app_attest_db_name}"')
    finally:
        await admin.close()
    conn = await connect(settings)
    try:
        for migration in load_migrations()[:3]:
            await conn.execute(migration.sql)
        await conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        await conn.execute("INSERT INTO alembic_version VALUES ('5b4ed32c7b2b')")
    finally:
        await conn.close()
    assert await migrate(settings) == ALL_VERSIONS[3:]


async def test_migrate_command_reports_unreachable_database(capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(postgres=PostgresSettings(host="127.0.0.1", port=1, password="s3cret-pw"))
    assert await asyncio.to_thread(migrate_command, settings) == 69  # EX_UNAVAILABLE (docs/operations.md, "Start-up errors")
    err = capsys.readouterr().err
    assert "127.0.0.1:1" in err and "s3cret-pw" not in err


async def test_open_pools_names_the_unreachable_database(pg_settings: PostgresSettings) -> None:
    with pytest.raises(DatabaseConnectError, match=r"127\.0\.0\.1:1, database 'litellm'"):
        async with open_pools(replace(pg_settings, port=1)):
            pass
    with pytest.raises(DatabaseConnectError, match="database 'no_such_db'"):
        async with open_pools(replace(pg_settings, app_attest_db_name="no_such_db")):
            pass
    wrong = "wrong-password-value"
    with pytest.raises(DatabaseConnectError) as caught:
        async with open_pools(replace(pg_settings, password=wrong)):
            pass
    assert wrong not in str(caught.value)


async def test_pools_use_the_configured_session_settings(pg_settings: PostgresSettings) -> None:
    async with open_pools(replace(pg_settings, statement_timeout_ms=1234, prepared_stmt_cache_max_size=0)) as pools:
        row = await pools.app.fetchrow(
            "SELECT current_setting('statement_timeout') AS st,"
            " current_setting('idle_in_transaction_session_timeout') AS idle,"
            " current_setting('application_name') AS app"
        )
        assert tuple(row) == ("1234ms", "10s", "mlpa:app_attest")
        assert await pools.litellm.fetchval("SELECT current_setting('application_name')") == "mlpa:litellm"


async def test_database_outage_and_recovery(pg_server: ThrowawayPostgres, pg_settings: PostgresSettings) -> None:
    async with open_pools(pg_settings) as pools:
        store = PostgresUserStore(pools, RecordingCreator(), pg_settings)
        await store.ensure_capacity_state(10, frozenset())
        assert await store.get_user("x:ai") is None
        pg_server.stop()
        try:
            for call in (
                store.get_user("x:ai"),
                store.list_users(10, 0),
                store.counts_by_service_type(),
                store.admit("x"),
                store.capacity_state(),
                store.set_blocked("x:ai", True),
                store.ensure_capacity_state(10, frozenset()),
            ):
                with pytest.raises(StoreUnavailable):
                    await asyncio.wait_for(call, 5)
            assert await store.ping() == {"postgres": False, "app_attest": False}
        finally:
            pg_server.start()
        # The pools replace their dead connections by themselves.
        assert await store.get_user("x:ai") is None
        assert (await store.admit("x")).admitted
        assert await store.ping() == {"postgres": True, "app_attest": True}


async def test_terminated_backends_are_replaced(pg_settings: PostgresSettings) -> None:
    async with open_pools(pg_settings) as pools:
        store = PostgresUserStore(pools, RecordingCreator(), pg_settings)
        assert await store.get_user("x:ai") is None
        admin = await asyncpg.connect(
            host=pg_settings.host, port=pg_settings.port, user=pg_settings.username,
            password=pg_settings.password, database="postgres",
        )  # fmt: skip
        try:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'mlpa:%'"
            )
        finally:
            await admin.close()
        assert killed >= 2
        await asyncio.sleep(0)
        assert await store.get_user("x:ai") is None
        assert await store.ping() == {"postgres": True, "app_attest": True}


async def test_rows_become_json_ready(pools: Pools) -> None:
    row = await pools.litellm.fetchrow(
        "SELECT now() AS at, current_date AS day, 1.25::numeric AS amount, interval '90 seconds' AS span,"
        " gen_random_uuid() AS id, '\\x0102'::bytea AS raw, ARRAY[now()] AS stamps, '{\"a\": 1}'::jsonb AS doc"
    )
    record = record_dict(row)
    json.dumps(record)
    assert record["amount"] == 1.25 and record["span"] == 90.0 and record["raw"] == "0102"
    assert isinstance(record["at"], str) and "T" in record["at"]


async def test_app_opens_and_closes_the_pools(
    pg_settings: PostgresSettings, aiohttp_client: Callable[..., Awaitable[TestClient]]
) -> None:
    app = create_app(replace(Settings.from_environ({"MLPA_DEBUG": "true"}), store="postgres", postgres=pg_settings))
    client = await aiohttp_client(app)
    pools = app[keys.PG_POOLS]
    assert await pools.litellm.fetchval("SELECT 1") == 1 and await pools.app.fetchval("SELECT 1") == 1
    await client.close()
    assert pools.litellm.is_closing() and pools.app.is_closing()
