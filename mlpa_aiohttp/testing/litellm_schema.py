"""DEVELOPMENT AND TESTS ONLY: stand-ins of LiteLLM's two tables, and end users written there.

In production LiteLLM creates and owns `"LiteLLM_EndUserTable"` and `"LiteLLM_BudgetTable"`
(its own migration, at its start). Without a real LiteLLM - the tests, `python -m
mlpa_aiohttp stack` - nothing would, so this module creates the columns mlpa-aiohttp uses
(`litellm_dev_schema.sql`) and refuses a database that LiteLLM itself has migrated.
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

import asyncpg

from ..settings import PostgresSettings
from ..store.migrate import MAINTENANCE_DB, quote_ident

LITELLM_DEV_SCHEMA = (importlib.resources.files(__package__) / "litellm_dev_schema.sql").read_text(encoding="utf-8")

# Tables only LiteLLM's own migration creates: their presence means a real LiteLLM database.
REAL_LITELLM_MARKERS = ("_prisma_migrations", "LiteLLM_VerificationToken")

# An end user as LiteLLM's `/customer/new` writes it (the tests' customer creator reuses it).
INSERT_END_USER = (
    'INSERT INTO "LiteLLM_EndUserTable" (user_id, budget_id, blocked, spend) VALUES ($1, $2, false, 0)'
)


class RealLiteLLMDatabase(RuntimeError):
    """The target database belongs to a real LiteLLM: the development schema must not touch it."""


async def _connect(pg: PostgresSettings, database: str) -> asyncpg.Connection:
    return await asyncpg.connect(
        host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=database
    )


async def create_litellm_dev_schema(pg: PostgresSettings) -> bool:
    """Create the `LITELLM_DB_NAME` database if missing and the two tables in it.

    Returns True when the database was created. Raises `RealLiteLLMDatabase` when LiteLLM's
    own migration has been there (its tables are LiteLLM's to manage, not ours)."""
    admin = await _connect(pg, MAINTENANCE_DB)
    try:
        created = not await admin.fetchval("SELECT true FROM pg_database WHERE datname = $1", pg.litellm_db_name)
        if created:
            await admin.execute(f"CREATE DATABASE {quote_ident(pg.litellm_db_name)}")
    finally:
        await admin.close()
    conn = await _connect(pg, pg.litellm_db_name)
    try:
        for marker in REAL_LITELLM_MARKERS:
            if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", quote_ident(marker)):
                raise RealLiteLLMDatabase(
                    f"database {pg.litellm_db_name!r} at {pg.host}:{pg.port} has LiteLLM's own "
                    f"{marker!r} table: it belongs to a real LiteLLM, which owns its schema; "
                    "the development schema is not applied there"
                )
        await conn.execute(LITELLM_DEV_SCHEMA)
    finally:
        await conn.close()
    return created


class EndUserTable:
    """Writes end users into `"LiteLLM_EndUserTable"` the way LiteLLM's `/customer/new` does.

    Pass `insert` as the fake LiteLLM's `customer_sink`: a second insert of the same user
    raises (unique violation), which the fake answers with LiteLLM's "already exists" 400."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, pg: PostgresSettings) -> "EndUserTable":
        pool = await asyncpg.create_pool(
            host=pg.host,
            port=pg.port,
            user=pg.username,
            password=pg.password,
            database=pg.litellm_db_name,
            min_size=1,
            max_size=4,
        )
        return cls(pool)

    async def insert(self, user_id: str, budget_id: str | None) -> None:
        await self._pool.execute(INSERT_END_USER, user_id, budget_id)

    async def add_spend(self, user_id: str, cost: float) -> None:
        """LiteLLM's spend update after a completion (the fake LiteLLM's `spend_sink`)."""
        await self._pool.execute('UPDATE "LiteLLM_EndUserTable" SET spend = spend + $2 WHERE user_id = $1', user_id, cost)

    async def budget_row(self, budget_id: str) -> dict[str, Any] | None:
        """One budget row as `/customer/info` shows it (the fake LiteLLM's `budget_source`)."""
        row = await self._pool.fetchrow(
            "SELECT budget_id, max_budget, soft_budget, max_parallel_requests, tpm_limit, rpm_limit,"
            " model_max_budget, budget_duration, budget_reset_at"
            ' FROM "LiteLLM_BudgetTable" WHERE budget_id = $1',
            budget_id,
        )
        if row is None:
            return None
        found = dict(row)
        reset_at = found["budget_reset_at"]
        found["budget_reset_at"] = reset_at.isoformat() if reset_at is not None else None
        if isinstance(found["model_max_budget"], str):
            found["model_max_budget"] = json.loads(found["model_max_budget"])
        return found

    async def close(self) -> None:
        await self._pool.close()
