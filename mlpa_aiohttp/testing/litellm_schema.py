"""DEVELOPMENT AND TESTS ONLY: LiteLLM's own database schema, and end users written into it.

In production LiteLLM creates and owns its tables (`prisma migrate deploy` of its own
migrations, at its start). Without a real LiteLLM - the tests, `python -m mlpa_aiohttp stack` -
this module applies the same migrations: the plain SQL files LiteLLM ships in the
`litellm-proxy-extras` package (setup.cfg's `stack` extra pins the release the pinned LiteLLM
requires), in directory-name order, each file as one script, as Prisma applies them. What it
applied is recorded in a table of its own, so a database a real LiteLLM migrated (Prisma's
`_prisma_migrations`, LiteLLM's tables without that record) is refused, never touched.
"""

from __future__ import annotations

import datetime
import importlib.resources
import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..settings import PostgresSettings
from ..store.migrate import MAINTENANCE_DB, quote_ident
from .fake_litellm import CustomerExists

SCHEMA_PACKAGE = "litellm_proxy_extras"
# Which of LiteLLM's migrations this module applied (LiteLLM's own record is Prisma's table).
APPLIED_TABLE = "mlpa_dev_litellm_migrations"
# Any of these without APPLIED_TABLE: a database that a real LiteLLM has migrated.
REAL_LITELLM_MARKERS = ("_prisma_migrations", "LiteLLM_VerificationToken", "LiteLLM_EndUserTable")
# Two `stack` commands starting at once must not apply the same migration twice (the app
# database's `migrate` takes "mlpa" in its own database).
_APPLY_LOCK_KEY = 0x6D6C6C6D  # "mllm"

# An end user as LiteLLM's `/customer/new` writes it (the columns it leaves to their defaults
# stay so: models, object_permission_id, alias...).
INSERT_END_USER = (
    'INSERT INTO "LiteLLM_EndUserTable" (user_id, budget_id, blocked, spend) VALUES ($1, $2, false, 0)'
)
_SELECT_END_USER = 'SELECT * FROM "LiteLLM_EndUserTable" WHERE user_id = $1'
_SELECT_BUDGET = 'SELECT * FROM "LiteLLM_BudgetTable" WHERE budget_id = $1'
_SELECT_OBJECT_PERMISSION = 'SELECT * FROM "LiteLLM_ObjectPermissionTable" WHERE object_permission_id = $1'

# The fields of LiteLLM 1.106.12's `CustomerResponse` (`/customer/new`, `/customer/info`), in its
# order, and of the budget it nests (`LiteLLM_BudgetTableFull`).
CUSTOMER_FIELDS = (
    "user_id", "blocked", "alias", "spend", "allowed_model_region", "default_model", "models",
    "budget_id", "litellm_budget_table", "object_permission_id", "object_permission",
)  # fmt: skip
BUDGET_FIELDS = (
    "budget_id", "soft_budget", "max_budget", "max_parallel_requests", "tpm_limit", "rpm_limit",
    "tpd_limit", "model_max_budget", "budget_duration", "allowed_models", "temp_budget_increase",
    "temp_budget_expiry", "budget_reset_at", "created_at",
)  # fmt: skip


class LiteLLMSchemaUnavailable(RuntimeError):
    """LiteLLM's migrations are not installed (setup.cfg's `stack` extra)."""


class RealLiteLLMDatabase(RuntimeError):
    """The target database belongs to a real LiteLLM: its schema is LiteLLM's to manage."""


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sql: str


@dataclass(frozen=True, slots=True)
class SchemaApplied:
    database_created: bool
    migrations_applied: int
    migrations_known: int


def litellm_migrations() -> list[Migration]:
    """LiteLLM's migrations in the order Prisma applies them (directory names sort by time)."""
    try:
        root = importlib.resources.files(SCHEMA_PACKAGE) / "migrations"
    except ModuleNotFoundError:
        raise LiteLLMSchemaUnavailable(
            f"LiteLLM's database migrations ({SCHEMA_PACKAGE.replace('_', '-')}) are not installed: "
            "pip install -e '.[stack]'"
        ) from None
    folders = sorted((entry for entry in root.iterdir() if entry.is_dir()), key=lambda entry: entry.name)
    return [
        Migration(folder.name, (folder / "migration.sql").read_text(encoding="utf-8"))
        for folder in folders
        if (folder / "migration.sql").is_file()
    ]


async def _connect(pg: PostgresSettings, database: str) -> asyncpg.Connection:
    return await asyncpg.connect(
        host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=database
    )


async def apply_litellm_schema(pg: PostgresSettings) -> SchemaApplied:
    """Create the `LITELLM_DB_NAME` database if missing and bring it to LiteLLM's schema.

    Applies only the migrations not applied before (a LiteLLM bump adds some). Raises
    `RealLiteLLMDatabase` for a database a real LiteLLM migrated and
    `LiteLLMSchemaUnavailable` without the migrations package."""
    migrations = litellm_migrations()
    admin = await _connect(pg, MAINTENANCE_DB)
    try:
        created = not await admin.fetchval("SELECT true FROM pg_database WHERE datname = $1", pg.litellm_db_name)
        if created:
            await admin.execute(f"CREATE DATABASE {quote_ident(pg.litellm_db_name)}")
    finally:
        await admin.close()
    conn = await _connect(pg, pg.litellm_db_name)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _APPLY_LOCK_KEY)
        applied = await _applied_before(conn, pg)
        pending = [migration for migration in migrations if migration.name not in applied]
        for migration in pending:
            # One script per file, no transaction of ours around it: a multi-statement script
            # is one implicit transaction, and a lone CREATE INDEX CONCURRENTLY (which refuses
            # to run inside one) runs on its own, as under `prisma migrate deploy`.
            await conn.execute(migration.sql)
            await conn.execute(f"INSERT INTO {APPLIED_TABLE} (name) VALUES ($1)", migration.name)
    finally:
        await conn.close()  # also releases the advisory lock
    return SchemaApplied(created, len(pending), len(migrations))


async def _applied_before(conn: asyncpg.Connection, pg: PostgresSettings) -> set[str]:
    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", APPLIED_TABLE):
        return {row["name"] for row in await conn.fetch(f"SELECT name FROM {APPLIED_TABLE}")}
    for marker in REAL_LITELLM_MARKERS:
        if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", quote_ident(marker)):
            raise RealLiteLLMDatabase(
                f"database {pg.litellm_db_name!r} at {pg.host}:{pg.port} has LiteLLM's {marker!r} table and "
                "was not set up by this command: it belongs to a real LiteLLM, whose schema is LiteLLM's to "
                "manage. Point LITELLM_DB_NAME at a database that does not exist yet (it is created), "
                "e.g. LITELLM_DB_NAME=litellm_dev"
            )
    await conn.execute(f"CREATE TABLE {APPLIED_TABLE} (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
    return set()


def _utc_text(value: Any) -> Any:
    """A timestamp as LiteLLM's JSON shows it: ISO 8601 in UTC (its columns hold UTC, no zone)."""
    if isinstance(value, datetime.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=datetime.UTC)).isoformat()
    return value


async def _decode_json_columns(conn: asyncpg.Connection) -> None:
    for json_type in ("json", "jsonb"):
        await conn.set_type_codec(json_type, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class EndUserTable:
    """LiteLLM's end users in its real table: what `/customer/new` writes and `/customer/info`
    reads, for the fake LiteLLM (`FakeLiteLLM(customer_table=...)`) and the tests."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool  # opened by `open`, with JSON columns decoded

    @classmethod
    async def open(cls, pg: PostgresSettings) -> EndUserTable:
        pool = await asyncpg.create_pool(
            host=pg.host,
            port=pg.port,
            user=pg.username,
            password=pg.password,
            database=pg.litellm_db_name,
            min_size=1,
            max_size=4,
            init=_decode_json_columns,
        )
        return cls(pool)

    async def insert(self, user_id: str, budget_id: str | None) -> None:
        """Raises `CustomerExists` for a user already there (LiteLLM's unique constraint);
        any other refusal (a budget id with no budget row: the foreign key) as the database's error."""
        try:
            await self._pool.execute(INSERT_END_USER, user_id, budget_id)
        except asyncpg.UniqueViolationError:
            raise CustomerExists(user_id) from None

    async def find(self, user_id: str) -> dict[str, Any] | None:
        """The end user as `/customer/info` answers it: its row with its budget and its object
        permission joined, in LiteLLM's field order."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(_SELECT_END_USER, user_id)
            if row is None:
                return None
            budget = await conn.fetchrow(_SELECT_BUDGET, row["budget_id"]) if row["budget_id"] else None
            permission = (
                await conn.fetchrow(_SELECT_OBJECT_PERMISSION, row["object_permission_id"])
                if row["object_permission_id"]
                else None
            )
        joined = {
            **dict(row),
            "litellm_budget_table": None if budget is None else {f: _utc_text(budget[f]) for f in BUDGET_FIELDS},
            "object_permission": None if permission is None else {k: _utc_text(v) for k, v in permission.items()},
        }
        return {field: joined[field] for field in CUSTOMER_FIELDS}

    async def add_spend(self, user_id: str, cost: float) -> None:
        """LiteLLM's spend update after a completion."""
        await self._pool.execute('UPDATE "LiteLLM_EndUserTable" SET spend = spend + $2 WHERE user_id = $1', user_id, cost)

    async def close(self) -> None:
        await self._pool.close()
