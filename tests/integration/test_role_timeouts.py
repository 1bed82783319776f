"""`migrate` sets the role-level timeouts that still hold behind PgBouncer's transaction
pooling, where the session settings sent at connect never reach the server connection.

A dedicated role owns a dedicated database; "a pooled connection" is a fresh connection
as that role that sends no settings at all, which is what a query behind PgBouncer gets."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import replace
from typing import AsyncIterator

import asyncpg
import pytest

from mlpa_aiohttp.settings import PostgresSettings, Settings
from mlpa_aiohttp.store.migrate import migrate, quote_ident, role_timeout_defaults

pytestmark = pytest.mark.postgres

ROLE = "mlpa_role_timeouts"
PASSWORD = "role-timeouts-password"
DATABASE = "app_attest_role_timeouts"


async def superuser(pg: PostgresSettings, database: str = "postgres") -> asyncpg.Connection:
    return await asyncpg.connect(host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=database)


@pytest.fixture
async def role_settings(pg_settings: PostgresSettings) -> AsyncIterator[PostgresSettings]:
    """A login role (not a superuser) owning its own app database."""
    conn = await superuser(pg_settings)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
        await conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        await conn.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        yield replace(
            pg_settings,
            username=ROLE,
            password=PASSWORD,
            app_attest_db_name=DATABASE,
            statement_timeout_ms=300,
            idle_in_tx_timeout_ms=400,
        )
    finally:
        await conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await conn.execute(f"DROP ROLE IF EXISTS {ROLE}")
        await conn.close()


async def pooled_connection(pg: PostgresSettings) -> asyncpg.Connection:
    """What a query behind PgBouncer transaction pooling gets: no session settings."""
    return await asyncpg.connect(
        host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=pg.app_attest_db_name,
        server_settings={},
    )


async def test_a_statement_past_the_role_timeout_is_cancelled(role_settings: PostgresSettings) -> None:
    before = await pooled_connection(role_settings)
    try:
        assert await before.fetchval("SHOW statement_timeout") == "0"
    finally:
        await before.close()

    await migrate(Settings(postgres=role_settings))

    conn = await pooled_connection(role_settings)
    try:
        assert await conn.fetchval("SHOW statement_timeout") == "300ms"
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "400ms"
        # The role's 300 ms cancels a 5 s sleep (the session has no timeout of its own).
        with pytest.raises(asyncpg.QueryCanceledError, match="statement timeout"):
            await conn.execute("SELECT pg_sleep(5)")
        assert await conn.fetchval("SELECT 1") == 1  # a short one still runs
    finally:
        await conn.close()

    # A transaction left idle past its timeout is ended by the server.
    idle = await pooled_connection(role_settings)
    try:
        transaction = idle.transaction()
        await transaction.start()
        await asyncio.sleep(0.1)  # within the timeout: fine
        assert await idle.fetchval("SELECT 1") == 1
        await asyncio.sleep(1.0)  # past it: the server ends the session
        with pytest.raises(
            (asyncpg.IdleInTransactionSessionTimeoutError, asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError)
        ):
            await idle.fetchval("SELECT 1")
        assert idle.is_closed()
    finally:
        await idle.close()


async def test_role_timeouts_are_idempotent_reset_by_zero_and_skippable(role_settings: PostgresSettings) -> None:
    admin = await superuser(role_settings)
    try:
        await migrate(Settings(postgres=role_settings))
        first = await role_timeout_defaults(admin, ROLE)
        await migrate(Settings(postgres=role_settings))
        assert await role_timeout_defaults(admin, ROLE) == first == {
            "statement_timeout": "300ms",
            "idle_in_transaction_session_timeout": "400ms",
        }

        # Skipped: the role is left as it is, even when the settings differ.
        await migrate(Settings(postgres=replace(role_settings, statement_timeout_ms=900)), role_timeouts=False)
        assert await role_timeout_defaults(admin, ROLE) == first

        # 0 resets that parameter, as the reference does.
        await migrate(Settings(postgres=replace(role_settings, statement_timeout_ms=0)))
        assert await role_timeout_defaults(admin, ROLE) == {"idle_in_transaction_session_timeout": "400ms"}
    finally:
        await admin.close()


def test_the_cli_flag_skips_role_timeouts(role_settings: PostgresSettings) -> None:
    environ = {
        "PATH": os.environ["PATH"],
        "DB_HOST": role_settings.host,
        "DB_PORT": str(role_settings.port),
        "DB_USERNAME": ROLE,
        "DB_PASSWORD": PASSWORD,
        "APP_ATTEST_DB_NAME": DATABASE,
        "PG_STATEMENT_TIMEOUT_MS": "1234",
    }

    def run(*flags: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "mlpa_aiohttp", "migrate", *flags], env=environ, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def statement_timeout() -> str:
        conn = await pooled_connection(role_settings)
        try:
            return await conn.fetchval("SHOW statement_timeout")
        finally:
            await conn.close()

    run("--skip-role-timeouts")
    assert asyncio.run(statement_timeout()) == "0"
    output = run()
    assert "statement_timeout=1234ms" in output
    assert asyncio.run(statement_timeout()) == "1234ms"
    # A re-run changes nothing and says nothing about the role.
    assert "role_timeouts_set" not in run()
    assert asyncio.run(statement_timeout()) == "1234ms"
