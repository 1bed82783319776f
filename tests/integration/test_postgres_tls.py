"""Verified TLS to PostgreSQL (DB_SSL_MODE, DB_SSL_ROOT_CERT): a real server with TLS on and a
certificate from a CA the test makes. The right CA connects and the connection is encrypted;
a wrong CA, and a host name the certificate does not carry under verify-full, stop the
start with a message naming the setting, for the pools and for `migrate` alike."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import asyncpg
import pytest

from mlpa_aiohttp.settings import PostgresSettings, PostgresTLS, Settings
from mlpa_aiohttp.store.migrate import migrate
from mlpa_aiohttp.store.pools import DatabaseConnectError, open_pools
from tests.support.postgres import ThrowawayPostgres
from tests.support.processes import free_port
from tests.support.tls_certificates import TestCA

from ..conftest import TEST_SECRETS

pytestmark = pytest.mark.postgres

# The server's certificate names only this host; 127.0.0.1 reaches the same server under
# a name the certificate does not carry.
CERTIFIED_HOST = "localhost"
UNCERTIFIED_HOST = "127.0.0.1"


class TLSServer:
    def __init__(self, server: ThrowawayPostgres, good_ca: Path, wrong_ca: Path) -> None:
        self.server, self.good_ca, self.wrong_ca = server, good_ca, wrong_ca

    def settings(self, mode: str, root_cert: Path | None, *, host: str = CERTIFIED_HOST) -> PostgresSettings:
        tls = PostgresTLS(mode=mode, root_cert=str(root_cert) if root_cert else None)
        return replace(self.server.settings(), host=host, tls=tls)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    folder = tmp_path_factory.mktemp("pg-tls")
    ca, stranger = TestCA.create("mlpa test CA"), TestCA.create("some other CA")
    issued = ca.issue(CERTIFIED_HOST, dns_names=(CERTIFIED_HOST,))
    with ThrowawayPostgres(tls=issued) as server:
        asyncio.run(_create_litellm_database(server.settings()))
        yield TLSServer(server, ca.write(folder / "ca.pem"), stranger.write(folder / "wrong-ca.pem"))


async def _create_litellm_database(pg: PostgresSettings) -> None:
    conn = await asyncpg.connect(host=pg.host, port=pg.port, user=pg.username, password=pg.password,
                                 database="postgres", ssl="disable")
    try:
        await conn.execute(f"CREATE DATABASE {pg.litellm_db_name}")
    finally:
        await conn.close()


async def encrypted(pool: asyncpg.Pool) -> bool:
    return await pool.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")


async def test_verify_full_with_the_servers_ca_migrates_and_opens_encrypted_pools(tls_server: TLSServer) -> None:
    pg = tls_server.settings("verify-full", tls_server.good_ca)
    await migrate(Settings(postgres=pg), role_timeouts=False)
    async with open_pools(pg) as pools:
        assert await encrypted(pools.litellm) is True
        assert await encrypted(pools.app) is True
        assert await pools.app.fetchval("SELECT count(*) FROM schema_migrations") > 0


async def test_disable_connects_in_plain_text_to_the_same_server(tls_server: TLSServer) -> None:
    """The check above can tell: the same query says false without TLS."""
    async with open_pools(tls_server.settings("disable", None)) as pools:
        assert await encrypted(pools.litellm) is False


@pytest.mark.parametrize("mode", ["verify-full", "verify-ca", "require"])
async def test_a_wrong_ca_stops_the_pools_naming_the_setting(tls_server: TLSServer, mode: str) -> None:
    # With a root certificate, require verifies the chain, as libpq does.
    pg = tls_server.settings(mode, tls_server.wrong_ca)
    with pytest.raises(DatabaseConnectError) as refused:
        async with open_pools(pg):
            pass
    message = str(refused.value)
    assert "SSLCertVerificationError" in message
    assert f"DB_SSL_MODE={mode}" in message and f"DB_SSL_ROOT_CERT ({tls_server.wrong_ca})" in message
    assert pg.password not in message


async def test_verify_full_refuses_a_host_name_the_certificate_does_not_carry(tls_server: TLSServer) -> None:
    pg = tls_server.settings("verify-full", tls_server.good_ca, host=UNCERTIFIED_HOST)
    with pytest.raises(DatabaseConnectError) as refused:
        async with open_pools(pg):
            pass
    assert f"must name DB_HOST ({UNCERTIFIED_HOST})" in str(refused.value)
    # verify-ca checks the chain only: the same host connects, encrypted.
    async with open_pools(replace(pg, tls=replace(pg.tls, mode="verify-ca"))) as pools:
        assert await encrypted(pools.app) is True


async def test_require_without_a_root_certificate_encrypts_without_verifying(tls_server: TLSServer) -> None:
    async with open_pools(tls_server.settings("require", None, host=UNCERTIFIED_HOST)) as pools:
        assert await encrypted(pools.litellm) is True


def run_migrate(tls_server: TLSServer, **extra: str) -> subprocess.CompletedProcess[str]:
    pg = tls_server.server.settings()
    environ = {
        "PATH": os.environ["PATH"],
        "DB_HOST": CERTIFIED_HOST,
        "DB_PORT": str(pg.port),
        "DB_USERNAME": pg.username,
        "DB_PASSWORD": pg.password,
        "APP_ATTEST_DB_NAME": "app_attest_tls_cli",
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "migrate", "--skip-role-timeouts"],
        env=environ, capture_output=True, text=True, timeout=60, check=False,
    )


def test_the_migrate_command_verifies_the_server_by_the_settings(tls_server: TLSServer) -> None:
    refused = run_migrate(tls_server, DB_SSL_MODE="verify-full", DB_SSL_ROOT_CERT=str(tls_server.wrong_ca))
    assert refused.returncode == 69, refused.stderr
    output = refused.stdout + refused.stderr
    assert "DB_SSL_ROOT_CERT" in output and "Traceback" not in output
    done = run_migrate(tls_server, DB_SSL_MODE="verify-full", DB_SSL_ROOT_CERT=str(tls_server.good_ca))
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_unreadable_root_certificate_is_a_configuration_error(tls_server: TLSServer, tmp_path: Path) -> None:
    missing = tmp_path / "absent.pem"
    refused = run_migrate(tls_server, DB_SSL_MODE="verify-full", DB_SSL_ROOT_CERT=str(missing))
    assert refused.returncode == 78
    assert f"DB_SSL_ROOT_CERT: cannot read '{missing}'" in refused.stdout + refused.stderr


def test_serve_stops_at_start_on_a_wrong_ca_naming_the_setting(tls_server: TLSServer) -> None:
    pg = tls_server.server.settings()
    environ = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        **TEST_SECRETS,
        "MLPA_STORE": "postgres",
        "LITELLM_API_BASE": f"http://127.0.0.1:{free_port()}",
        "PORT": str(free_port()),
        "DB_HOST": CERTIFIED_HOST,
        "DB_PORT": str(pg.port),
        "DB_USERNAME": pg.username,
        "DB_PASSWORD": pg.password,
        "DB_SSL_MODE": "verify-full",
        "DB_SSL_ROOT_CERT": str(tls_server.wrong_ca),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1"],
        env=environ, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 69, done.stdout + done.stderr
    [message] = [line for line in done.stderr.splitlines() if "database_unavailable" in line]
    assert f"DB_SSL_MODE=verify-full the server's certificate must chain to DB_SSL_ROOT_CERT ({tls_server.wrong_ca})" in message
    assert "Traceback" not in done.stdout + done.stderr and pg.password not in done.stdout + done.stderr
