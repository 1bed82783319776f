"""No pod ready on a schema it does not have: the app database a migration behind keeps
readiness at 503 (one ERROR line at start naming the missing migration) until `migrate` runs,
then readiness turns 200 without a restart; a database ahead of the release (a newer
release's migration) is reported and does not take the pod out. Real PostgreSQL, real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.settings import PostgresSettings, Settings
from mlpa_aiohttp.store.capacity import seed_capacity_row
from mlpa_aiohttp.store.migrate import (
    apply_migrations,
    create_database_if_missing,
    load_migrations,
    migrate,
)
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from tests.support.postgres import database_environ

from ..conftest import TEST_SECRETS, events, make_settings

pytestmark = pytest.mark.postgres

BEHIND = "app_attest_schema_behind"
LAST = load_migrations()[-1].version


async def connect(pg: PostgresSettings, database: str) -> asyncpg.Connection:
    return await asyncpg.connect(host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=database)


@pytest.fixture
async def behind(pg_settings: PostgresSettings) -> AsyncIterator[PostgresSettings]:
    """An app database with every migration of this release but the last."""
    maintenance = await connect(pg_settings, pg_settings.litellm_db_name)
    try:
        await maintenance.execute(f"DROP DATABASE IF EXISTS {BEHIND}")
        await create_database_if_missing(pg_settings, BEHIND)
        conn = await connect(pg_settings, BEHIND)
        try:
            await apply_migrations(conn, load_migrations()[:-1])
            await seed_capacity_row(conn, 1_000_000)
        finally:
            await conn.close()
        yield replace(pg_settings, app_attest_db_name=BEHIND)
    finally:
        await maintenance.execute(f"DROP DATABASE IF EXISTS {BEHIND} WITH (FORCE)")
        await maintenance.close()


ServiceOn = Callable[[PostgresSettings], Awaitable[tuple[TestClient, Settings]]]


@pytest.fixture
async def service_on(aiohttp_client, aiohttp_server, fxa_signing_key) -> ServiceOn:
    litellm = FakeLiteLLM(virtual_key=TEST_SECRETS["MLPA_VIRTUAL_KEY"], master_key=TEST_SECRETS["MASTER_KEY"])
    litellm_server = await aiohttp_server(litellm.make_app())
    fxa_server = await aiohttp_server(FakeFxA(first_key=fxa_signing_key).make_app())

    async def start(pg: PostgresSettings) -> tuple[TestClient, Settings]:
        settings = make_settings(
            str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")), **database_environ(pg)
        )
        return await aiohttp_client(create_app(settings)), settings

    return start


async def test_a_migration_behind_keeps_the_pod_unready_until_migrate_runs(
    behind: PostgresSettings, service_on: ServiceOn, caplog: pytest.LogCaptureFixture
) -> None:
    client, settings = await service_on(behind)
    [line] = events(caplog, "app_database_schema_behind")
    assert line["level"] == "ERROR" and line["missing"] == [LAST] and line["unknown"] == []
    assert line["database"] == BEHIND

    for _ in range(2):  # every probe re-reads, and stays 503 while the migration is missing
        readiness = await client.get("/health/readiness")
        body = await readiness.json()
        assert readiness.status == 503, body
        assert body["app_database_schema"] == {"missing": [LAST], "unknown": []}
        assert body["pg_server_dbs"] == {"postgres": "connected", "app_attest": "connected"}

    assert await migrate(settings, role_timeouts=False) == [LAST]  # the Job runs
    readiness = await client.get("/health/readiness")
    body = await readiness.json()
    assert readiness.status == 200, body
    assert body["status"] == "connected" and "app_database_schema" not in body
    assert len(events(caplog, "app_database_schema_current")) == 1
    assert len(events(caplog, "app_database_schema_behind")) == 1  # said once, at start


async def test_a_database_ahead_of_the_release_is_reported_and_the_pod_serves(
    behind: PostgresSettings, service_on: ServiceOn, caplog: pytest.LogCaptureFixture
) -> None:
    await migrate(Settings(postgres=behind), role_timeouts=False)
    conn = await connect(behind, BEHIND)
    try:
        await conn.execute("INSERT INTO schema_migrations (version) VALUES ('9999_from_a_newer_release')")
    finally:
        await conn.close()
    client, _settings = await service_on(behind)
    [line] = events(caplog, "app_database_schema_ahead")
    assert line["level"] == "WARNING" and line["unknown"] == ["9999_from_a_newer_release"]
    assert not events(caplog, "app_database_schema_behind")
    readiness = await client.get("/health/readiness")
    body = await readiness.json()
    assert readiness.status == 200, body
    assert body["app_database_schema"] == {"missing": [], "unknown": ["9999_from_a_newer_release"]}


async def test_the_current_schema_adds_nothing_to_readiness(
    pg_settings: PostgresSettings, service_on: ServiceOn, caplog: pytest.LogCaptureFixture
) -> None:
    client, _settings = await service_on(pg_settings)
    readiness = await client.get("/health/readiness")
    body = await readiness.json()
    assert readiness.status == 200, body
    assert "app_database_schema" not in body
    assert not events(caplog, "app_database_schema_behind") and not events(caplog, "app_database_schema_ahead")
