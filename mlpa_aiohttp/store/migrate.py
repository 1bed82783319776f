"""Schema migrations for the app database (`APP_ATTEST_DB_NAME`), run as a deploy step.

`python -m mlpa_aiohttp migrate` (compatibility.md D20) runs `migrate`. The steps:

1. create the database if missing (through the `postgres` maintenance database);
2. take a session advisory lock, so concurrent runs (two pods, a retried Job) queue up;
3. apply each `migrations/NNNN_name.sql` not yet in `schema_migrations`, each file in its
   own transaction together with its version row;
4. seed the signup-capacity row and set its maximum from `MLPA_MAX_SIGNED_IN_USERS`;
5. set `statement_timeout` and `idle_in_transaction_session_timeout` on the database role
   (`ALTER ROLE ... SET`), as the reference's deploy script does: behind PgBouncer in
   transaction pooling the session settings sent at connect never reach the server
   connection that runs a query, the role's defaults do. A value of 0 resets the role's
   default. `migrate --skip-role-timeouts` leaves the role alone (a role managed elsewhere).

A database last migrated by the reference system's Alembic chain is adopted: its
`alembic_version` marks the matching files as already applied. Nothing here runs at app
startup.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass

import asyncpg
import structlog

from ..settings import PostgresSettings, Settings
from .capacity import seed_capacity_row
from .pools import CONNECT_TIMEOUT_S, DATABASE_ERRORS, connect_error, db_errors

log = structlog.get_logger(__name__)

MAINTENANCE_DB = "postgres"
# Arbitrary but fixed: every migrate run of this application contends for this key.
ADVISORY_LOCK_KEY = 0x6D6C7061  # "mlpa"

# The reference system's Alembic revisions and the file each corresponds to.
ALEMBIC_REVISIONS: dict[str, str] = {
    "8c787d0fbdc8": "0001_challenges",
    "482f016f00d7": "0002_public_keys",
    "5b4ed32c7b2b": "0003_public_keys_counter",
    "919c4d382c42": "0004_user_capacity",
    "b3ea148a6d0b": "0005_storage_tuning",
}


@dataclass(frozen=True, slots=True)
class Migration:
    version: str
    sql: str


def load_migrations() -> list[Migration]:
    folder = importlib.resources.files(__package__) / "migrations"
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [Migration(f.name.removesuffix(".sql"), f.read_text(encoding="utf-8")) for f in files]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _connect(pg: PostgresSettings, database: str) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(
            host=pg.host,
            port=pg.port,
            user=pg.username,
            password=pg.password,
            database=database,
            statement_cache_size=pg.prepared_stmt_cache_max_size,
            timeout=CONNECT_TIMEOUT_S,
            server_settings={
                "application_name": "mlpa:migrate",
                "statement_timeout": f"{pg.maintenance_statement_timeout_ms}ms",
            },
            ssl=pg.tls.ssl_argument(),
        )
    except DATABASE_ERRORS as exc:
        raise connect_error(pg, database, exc) from exc


async def create_database_if_missing(pg: PostgresSettings, name: str) -> bool:
    """True when this call created it."""
    conn = await _connect(pg, MAINTENANCE_DB)
    try:
        with db_errors(f"create database {name!r}"):
            if await conn.fetchval("SELECT true FROM pg_database WHERE datname = $1", name):
                return False
            try:
                await conn.execute(f"CREATE DATABASE {quote_ident(name)}")
            except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                return False  # a concurrent run created it first
            return True
    finally:
        await conn.close()


async def _adopt_alembic(conn: asyncpg.Connection, known: list[Migration]) -> None:
    """Record the files an Alembic-migrated database already has (first run only)."""
    if await conn.fetchval("SELECT count(*) FROM schema_migrations"):
        return
    if not await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL"):
        return
    revision = await conn.fetchval("SELECT version_num FROM alembic_version LIMIT 1")
    last = ALEMBIC_REVISIONS.get(revision or "")
    if last is None:
        return
    versions = [m.version for m in known if m.version <= last]
    await conn.executemany("INSERT INTO schema_migrations (version) VALUES ($1)", [(v,) for v in versions])
    log.info("alembic_revision_adopted", revision=revision, as_version=last)


async def apply_migrations(conn: asyncpg.Connection, migrations: list[Migration]) -> list[str]:
    """Apply what is missing under the advisory lock; returns the versions applied now."""
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version TEXT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT NOW())"
        )
        async with conn.transaction():
            await _adopt_alembic(conn, migrations)
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for migration in migrations:
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", migration.version)
            applied_now.append(migration.version)
            log.info("migration_applied", version=migration.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
    return applied_now


ROLE_TIMEOUT_PARAMETERS = ("statement_timeout", "idle_in_transaction_session_timeout")


async def role_timeout_defaults(conn: asyncpg.Connection, role: str) -> dict[str, str]:
    """The role's own defaults (all databases) for the timeout parameters."""
    rows = await conn.fetchval(
        "SELECT setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE r.rolname = $1 AND s.setdatabase = 0",
        role,
    )
    pairs = (item.split("=", 1) for item in rows or [])
    return {name: value for name, value in pairs if name in ROLE_TIMEOUT_PARAMETERS}


async def apply_role_timeouts(conn: asyncpg.Connection, pg: PostgresSettings) -> dict[str, str | None]:
    """Make the role's defaults match the settings; returns what changed (None: reset).
    Idempotent: a role that already matches is not altered."""
    wanted = {
        "statement_timeout": pg.statement_timeout_ms,
        "idle_in_transaction_session_timeout": pg.idle_in_tx_timeout_ms,
    }
    current = await role_timeout_defaults(conn, pg.username)
    role = quote_ident(pg.username)
    changed: dict[str, str | None] = {}
    for parameter, milliseconds in wanted.items():
        value = f"{int(milliseconds)}ms" if milliseconds else None
        if current.get(parameter) == value:
            continue
        if value is None:
            await conn.execute(f"ALTER ROLE {role} RESET {parameter}")
        else:
            # Utility statements take no bind parameters; the value is a formatted int.
            await conn.execute(f"ALTER ROLE {role} SET {parameter} = '{value}'")
        changed[parameter] = value
    return changed


async def migrate(settings: Settings, *, role_timeouts: bool = True) -> list[str]:
    """Bring the app database up to date; returns the versions applied by this run."""
    pg = settings.postgres
    if await create_database_if_missing(pg, pg.app_attest_db_name):
        log.info("database_created", database=pg.app_attest_db_name)
    conn = await _connect(pg, pg.app_attest_db_name)
    try:
        with db_errors("migrate"):
            applied = await apply_migrations(conn, load_migrations())
            async with conn.transaction():
                await seed_capacity_row(conn, settings.signup_cap.max_signed_in_users)
            if role_timeouts:
                changed = await apply_role_timeouts(conn, pg)
                if changed:  # a re-run that changes nothing stays quiet
                    log.info(
                        "role_timeouts_set",
                        role=pg.username,
                        **{name: value or "RESET" for name, value in changed.items()},
                    )
    finally:
        await conn.close()
    return applied
