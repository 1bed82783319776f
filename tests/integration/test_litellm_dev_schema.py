"""The development stand-ins of LiteLLM's tables and the fake LiteLLM writing end users there."""

from __future__ import annotations

from dataclasses import replace
from typing import AsyncIterator

import asyncpg
import pytest

from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from mlpa_aiohttp.testing.litellm_schema import EndUserTable, RealLiteLLMDatabase, create_litellm_dev_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
async def fresh_litellm_db(pg_settings: PostgresSettings) -> AsyncIterator[PostgresSettings]:
    """A LiteLLM database of its own (the session's `litellm` stays as the other tests need it)."""
    settings = replace(pg_settings, litellm_db_name="litellm_dev_schema_test")
    yield settings
    admin = await asyncpg.connect(
        host=settings.host, port=settings.port, user=settings.username, password=settings.password, database="postgres"
    )
    try:
        await admin.execute('DROP DATABASE IF EXISTS "litellm_dev_schema_test" WITH (FORCE)')
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


async def test_creates_the_database_and_both_tables_once(fresh_litellm_db: PostgresSettings) -> None:
    assert await create_litellm_dev_schema(fresh_litellm_db) is True
    assert await create_litellm_dev_schema(fresh_litellm_db) is False  # idempotent
    conn = await connect(fresh_litellm_db)
    try:
        tables = {
            row["table_name"]
            for row in await conn.fetch("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        }
    finally:
        await conn.close()
    assert tables == {"LiteLLM_EndUserTable", "LiteLLM_BudgetTable"}


async def test_refuses_a_database_a_real_litellm_migrated(fresh_litellm_db: PostgresSettings) -> None:
    await create_litellm_dev_schema(fresh_litellm_db)
    conn = await connect(fresh_litellm_db)
    try:
        await conn.execute('CREATE TABLE "LiteLLM_VerificationToken" (token TEXT PRIMARY KEY)')
    finally:
        await conn.close()
    with pytest.raises(RealLiteLLMDatabase, match="LiteLLM_VerificationToken"):
        await create_litellm_dev_schema(fresh_litellm_db)


async def test_fake_litellm_creates_end_users_in_the_table(aiohttp_client, fresh_litellm_db: PostgresSettings) -> None:
    await create_litellm_dev_schema(fresh_litellm_db)
    table = await EndUserTable.open(fresh_litellm_db)
    try:
        fake = FakeLiteLLM(master_key="sk-master", customer_sink=table.insert)
        client = await aiohttp_client(fake.make_app())
        headers = {"authorization": "Bearer sk-master"}
        body = {"user_id": "uid-1:ai", "budget_id": "end-user-budget-ai"}
        created = await client.post("/customer/new", json=body, headers=headers)
        assert created.status == 200
        again = await client.post("/customer/new", json=body, headers=headers)
        assert again.status == 400  # LiteLLM's "already exists", decided by the table's key
        assert "already exists" in (await again.json())["error"]["message"]
    finally:
        await table.close()
    conn = await connect(fresh_litellm_db)
    try:
        rows = await conn.fetch('SELECT user_id, budget_id, blocked, spend FROM "LiteLLM_EndUserTable"')
    finally:
        await conn.close()
    assert [tuple(row) for row in rows] == [("uid-1:ai", "end-user-budget-ai", False, 0.0)]
