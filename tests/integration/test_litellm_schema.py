"""LiteLLM's own schema (its migrations, as `stack` and the tests apply them) and the fake
LiteLLM writing and reading end users there, over real HTTP and a real PostgreSQL server."""

from __future__ import annotations

from dataclasses import replace
from typing import AsyncIterator

import asyncpg
import pytest

from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from mlpa_aiohttp.testing.litellm_schema import (
    APPLIED_TABLE,
    CUSTOMER_FIELDS,
    EndUserTable,
    RealLiteLLMDatabase,
    apply_litellm_schema,
    litellm_migrations,
)

from .conftest import insert_budget_row

pytestmark = pytest.mark.postgres

MASTER = {"authorization": "Bearer sk-master"}


@pytest.fixture
async def fresh_litellm_db(pg_settings: PostgresSettings) -> AsyncIterator[PostgresSettings]:
    """A LiteLLM database of its own (the session's `litellm` stays as the other tests need it)."""
    settings = replace(pg_settings, litellm_db_name="litellm_schema_test")
    yield settings
    admin = await asyncpg.connect(
        host=settings.host, port=settings.port, user=settings.username, password=settings.password, database="postgres"
    )
    try:
        await admin.execute('DROP DATABASE IF EXISTS "litellm_schema_test" WITH (FORCE)')
    finally:
        await admin.close()


async def connect(settings: PostgresSettings) -> asyncpg.Connection:
    return await asyncpg.connect(
        host=settings.host,
        port=settings.port,
        user=settings.username,
        password=settings.password,
        database=settings.litellm_db_name,
    )


def test_the_migrations_are_litellms_in_their_order() -> None:
    migrations = litellm_migrations()
    names = [migration.name for migration in migrations]
    assert names == sorted(names) and len(names) == len(set(names))
    assert names[0].endswith("_baseline")
    # One of LiteLLM's directory names has spaces: it is applied like any other.
    assert any(" " in name for name in names)


async def test_creates_the_database_applies_every_migration_once_and_records_them(
    fresh_litellm_db: PostgresSettings,
) -> None:
    known = len(litellm_migrations())
    first = await apply_litellm_schema(fresh_litellm_db)
    assert (first.database_created, first.migrations_applied, first.migrations_known) == (True, known, known)
    again = await apply_litellm_schema(fresh_litellm_db)
    assert (again.database_created, again.migrations_applied) == (False, 0)
    conn = await connect(fresh_litellm_db)
    try:
        assert await conn.fetchval(f"SELECT count(*) FROM {APPLIED_TABLE}") == known
        # LiteLLM's end-user table as its migrations leave it: the foreign key to the budget
        # table (ON DELETE SET NULL) that the service's repairs exist for, and its later columns.
        fkey = await conn.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'LiteLLM_EndUserTable_budget_id_fkey'"
        )
        columns = {
            row["column_name"]: row["data_type"]
            for row in await conn.fetch(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'LiteLLM_BudgetTable'"
            )
        }
    finally:
        await conn.close()
    assert fkey == 'FOREIGN KEY (budget_id) REFERENCES "LiteLLM_BudgetTable"(budget_id) ON UPDATE CASCADE ON DELETE SET NULL'
    assert columns["created_at"] == columns["updated_at"] == "timestamp without time zone"


async def test_applies_only_the_migrations_it_has_not_applied(fresh_litellm_db: PostgresSettings) -> None:
    await apply_litellm_schema(fresh_litellm_db)
    last = litellm_migrations()[-1].name
    conn = await connect(fresh_litellm_db)
    try:
        # As after a LiteLLM bump: the newest migration is not recorded yet. It is idempotent
        # (IF NOT EXISTS), as LiteLLM writes them, so running it again is harmless.
        await conn.execute(f"DELETE FROM {APPLIED_TABLE} WHERE name = $1", last)
    finally:
        await conn.close()
    assert (await apply_litellm_schema(fresh_litellm_db)).migrations_applied == 1


async def test_refuses_a_database_a_real_litellm_migrated(fresh_litellm_db: PostgresSettings) -> None:
    admin = await asyncpg.connect(
        host=fresh_litellm_db.host, port=fresh_litellm_db.port, user=fresh_litellm_db.username,
        password=fresh_litellm_db.password, database="postgres",
    )  # fmt: skip
    try:
        await admin.execute('CREATE DATABASE "litellm_schema_test"')
    finally:
        await admin.close()
    conn = await connect(fresh_litellm_db)
    try:
        await conn.execute('CREATE TABLE "_prisma_migrations" (id TEXT PRIMARY KEY)')
    finally:
        await conn.close()
    with pytest.raises(RealLiteLLMDatabase, match="_prisma_migrations.*LITELLM_DB_NAME"):
        await apply_litellm_schema(fresh_litellm_db)
    conn = await connect(fresh_litellm_db)
    try:
        tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    assert tables == 1  # untouched


async def test_the_fake_creates_and_reads_end_users_as_litellm_does(aiohttp_client, fresh_litellm_db: PostgresSettings) -> None:
    await apply_litellm_schema(fresh_litellm_db)
    table = await EndUserTable.open(fresh_litellm_db)
    try:
        pool = await asyncpg.create_pool(
            host=fresh_litellm_db.host, port=fresh_litellm_db.port, user=fresh_litellm_db.username,
            password=fresh_litellm_db.password, database=fresh_litellm_db.litellm_db_name, min_size=1, max_size=1,
        )  # fmt: skip
        await insert_budget_row(pool, "end-user-budget-ai")
        await pool.close()
        client = await aiohttp_client(FakeLiteLLM(master_key="sk-master", customer_table=table).make_app())

        body = {"user_id": "uid-1:ai", "budget_id": "end-user-budget-ai"}
        created = await client.post("/customer/new", json=body, headers=MASTER)
        assert created.status == 200
        customer = await created.json()
        assert tuple(customer) == CUSTOMER_FIELDS
        assert (customer["user_id"], customer["budget_id"], customer["blocked"], customer["spend"]) == (
            "uid-1:ai", "end-user-budget-ai", False, 0.0,
        )  # fmt: skip
        assert customer["models"] == [] and customer["object_permission"] is None
        assert customer["litellm_budget_table"]["budget_id"] == "end-user-budget-ai"
        assert customer["litellm_budget_table"]["created_at"].endswith("+00:00")

        again = await client.post("/customer/new", json=body, headers=MASTER)
        assert again.status == 400  # LiteLLM's "already exists", decided by the table's key
        assert (await again.json())["error"] == {
            "message": "Customer already exists, passed user_id=uid-1:ai. Please pass a new user_id.",
            "type": "bad_request",
            "param": "user_id",
            "code": "400",
        }

        # A budget id with no row: LiteLLM's foreign key refuses it, and LiteLLM answers 500.
        orphan = await client.post("/customer/new", json={"user_id": "uid-2:ai", "budget_id": "gone"}, headers=MASTER)
        assert orphan.status == 500
        assert (await orphan.json())["error"] == {
            "message": "Foreign key constraint failed on the field: `LiteLLM_EndUserTable_budget_id_fkey (index)`",
            "type": "internal_server_error",
            "param": None,
            "code": "500",
        }

        info = await client.get("/customer/info", params={"end_user_id": "uid-1:ai"}, headers=MASTER)
        assert (info.status, await info.json()) == (200, customer)
        unknown = await client.get("/customer/info", params={"end_user_id": "uid-2:ai"}, headers=MASTER)
        assert unknown.status == 404
        assert (await unknown.json())["error"] == {
            "message": "End User Id=uid-2:ai does not exist in db",
            "type": "not_found",
            "param": "end_user_id",
            "code": "404",
        }
    finally:
        await table.close()
