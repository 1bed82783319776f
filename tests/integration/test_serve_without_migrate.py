"""`serve` and gunicorn against an app database `migrate` never made: one message that says to
run `migrate`, over a real PostgreSQL server and real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.process.startup import EXIT_UNAVAILABLE, GUNICORN_WORKER_BOOT_ERROR
from mlpa_aiohttp.store.pools import Pools
from tests.support.processes import free_port

from ..conftest import TEST_SECRETS

pytestmark = pytest.mark.postgres

REPO_ROOT = Path(__file__).resolve().parents[2]
NEVER_MIGRATED = "app_never_migrated"


def environ(pg: PostgresSettings, app_database: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO_ROOT),
        **TEST_SECRETS,
        "MLPA_STORE": "postgres",
        "LITELLM_API_BASE": f"http://127.0.0.1:{free_port()}",
        "DB_HOST": pg.host,
        "DB_PORT": str(pg.port),
        "DB_USERNAME": pg.username,
        "DB_PASSWORD": pg.password,
        "LITELLM_DB_NAME": pg.litellm_db_name,
        "APP_ATTEST_DB_NAME": app_database,
        "PORT": str(free_port()),
        "GUNICORN_WORKERS": "1",
    }


@pytest.fixture
async def no_app_database(pools: Pools) -> str:
    await pools.litellm.execute(f"DROP DATABASE IF EXISTS {NEVER_MIGRATED}")
    return NEVER_MIGRATED


@pytest.fixture
async def empty_app_database(pools: Pools) -> str:
    """The app database exists (created by hand, say) but `migrate` never ran in it."""
    await pools.litellm.execute(f"DROP DATABASE IF EXISTS {NEVER_MIGRATED}")
    await pools.litellm.execute(f"CREATE DATABASE {NEVER_MIGRATED}")
    return NEVER_MIGRATED


COMMANDS = {
    "serve": ([sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1"], EXIT_UNAVAILABLE),
    "gunicorn": (
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"],
        GUNICORN_WORKER_BOOT_ERROR,
    ),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_missing_app_database_says_to_run_migrate(
    command: str, no_app_database: str, pg_settings: PostgresSettings
) -> None:
    argv, status = COMMANDS[command]
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=environ(pg_settings, no_app_database), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == status, done.stdout + done.stderr
    (message,) = [line for line in done.stderr.splitlines() if "database_unavailable" in line]
    assert f'database "{no_app_database}" does not exist' in message
    assert "`python -m mlpa_aiohttp migrate` creates the app database and its tables" in message
    assert "Traceback" not in done.stdout + done.stderr and pg_settings.password not in done.stdout + done.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
async def test_an_app_database_never_migrated_says_to_run_migrate(
    command: str, empty_app_database: str, pg_settings: PostgresSettings
) -> None:
    argv, status = COMMANDS[command]
    try:
        done = subprocess.run(
            argv, cwd=REPO_ROOT, env=environ(pg_settings, empty_app_database), capture_output=True, text=True, timeout=60
        )
    finally:
        conn = await asyncpg.connect(
            host=pg_settings.host, port=pg_settings.port, user=pg_settings.username,
            password=pg_settings.password, database=pg_settings.litellm_db_name,
        )
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {empty_app_database}")
        finally:
            await conn.close()
    assert done.returncode == status, done.stdout + done.stderr
    (message,) = [line for line in done.stderr.splitlines() if "database_unavailable" in line]
    assert 'relation "mlpa_user_capacity" does not exist' in message
    assert "`python -m mlpa_aiohttp migrate` creates the app database and its tables" in message
    assert "Traceback" not in done.stdout + done.stderr
