"""`python -m mlpa_aiohttp migrate`: runs without the service's secrets, is idempotent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import asyncpg
import pytest

from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.store.migrate import load_migrations
from mlpa_aiohttp.store.pools import Pools

pytestmark = pytest.mark.postgres


def run_migrate(pg: PostgresSettings, database: str, **extra: str) -> subprocess.CompletedProcess[str]:
    environ = {
        "PATH": os.environ["PATH"],
        "DB_HOST": pg.host,
        "DB_PORT": str(pg.port),
        "DB_USERNAME": pg.username,
        "DB_PASSWORD": pg.password,
        "APP_ATTEST_DB_NAME": database,
        "MLPA_MAX_SIGNED_IN_USERS": "42",
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "migrate"], env=environ, capture_output=True, text=True, timeout=60
    )


async def test_migrate_command_creates_and_upgrades_a_database(pg_settings: PostgresSettings, pools: Pools) -> None:
    database = "app_attest_cli_test"
    await pools.litellm.execute(f"DROP DATABASE IF EXISTS {database}")
    first = run_migrate(pg_settings, database)
    assert first.returncode == 0, first.stderr
    assert "applied" in first.stdout and pg_settings.password not in first.stdout + first.stderr
    # One line per migration applied, not a log line and a print of each.
    for migration in load_migrations():
        assert first.stdout.count(migration.version) == 1, first.stdout
    second = run_migrate(pg_settings, database)
    assert second.returncode == 0 and "applied=0" in second.stdout
    as_json = run_migrate(pg_settings, database, LOG_JSON="true")
    assert as_json.returncode == 0 and as_json.stderr == ""
    (done,) = [json.loads(line) for line in as_json.stdout.splitlines()]  # every line is JSON
    assert done["event"] == "migrate_done" and done["applied"] == 0 and done["database"] == database
    conn = await asyncpg.connect(
        host=pg_settings.host, port=pg_settings.port, user=pg_settings.username,
        password=pg_settings.password, database=database,
    )
    try:
        assert await conn.fetchval("SELECT max_identities FROM mlpa_user_capacity WHERE id = 1") == 42
    finally:
        await conn.close()
