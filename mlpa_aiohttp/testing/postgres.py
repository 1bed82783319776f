"""A throwaway PostgreSQL server for tests, CI and the demo, plus LiteLLM's two tables.

    with ThrowawayPostgres() as server:           # initdb + pg_ctl start in a temp dir
        settings = server.settings()              # PostgresSettings pointing at it
        asyncio.run(prepare_databases(settings))  # litellm schema + app migrations

The server runs as an unprivileged user (initdb refuses root): when the process is root
the data directory is handed to the `postgres` (or `nobody`) account and the binaries
run through `runuser`. fsync is off for speed; commits stay synchronous, so stopping the
server with `-m immediate` (outage tests) loses nothing. Missing binaries raise
`PostgresBinariesMissing`: tests must fail loudly, not skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from types import TracebackType

import asyncpg

from ..settings import PostgresSettings, Settings
from ..store.migrate import MAINTENANCE_DB, migrate, quote_ident

BIN_DIR_CANDIDATES = (
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/17/bin",
    "/usr/local/pgsql/bin",
)
UNPRIVILEGED_USERS = ("postgres", "nobody")
SUPERUSER = "mlpa_test"
PASSWORD = "mlpa-test-password"

# The columns of LiteLLM's tables that MLPA reads or writes (LiteLLM owns the real DDL).
LITELLM_SCHEMA = """
CREATE TABLE IF NOT EXISTS "LiteLLM_BudgetTable" (
    budget_id TEXT PRIMARY KEY,
    max_budget DOUBLE PRECISION,
    soft_budget DOUBLE PRECISION,
    max_parallel_requests INTEGER,
    tpm_limit BIGINT,
    rpm_limit BIGINT,
    model_max_budget JSONB,
    budget_duration TEXT,
    budget_reset_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    created_by TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    updated_by TEXT
);
CREATE TABLE IF NOT EXISTS "LiteLLM_EndUserTable" (
    user_id TEXT PRIMARY KEY,
    alias TEXT,
    spend DOUBLE PRECISION NOT NULL DEFAULT 0,
    allowed_model_region TEXT,
    default_model TEXT,
    budget_id TEXT,
    blocked BOOLEAN NOT NULL DEFAULT false
);
"""

LITELLM_TABLES = ('"LiteLLM_EndUserTable"', '"LiteLLM_BudgetTable"')
APP_TABLES = ("challenges", "public_keys", "mlpa_user_capacity", "mlpa_user_capacity_identities")


class PostgresBinariesMissing(RuntimeError):
    pass


def find_bin_dir() -> Path:
    initdb = shutil.which("initdb")
    candidates = [str(Path(initdb).resolve().parent)] if initdb else []
    candidates += list(BIN_DIR_CANDIDATES)
    # Debian/Ubuntu keep each major version apart; prefer the newest installed.
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major_version, reverse=True)
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    raise PostgresBinariesMissing(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in "
        + ", ".join(BIN_DIR_CANDIDATES)
        + "; install postgresql (Debian: apt-get install postgresql)"
    )


def _major_version(bin_dir: str) -> int:
    version = Path(bin_dir).parent.name
    return int(version) if version.isdigit() else 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThrowawayPostgres:
    """One PostgreSQL server in a temporary directory, on a free loopback port."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.port = free_port()
        self.host = "127.0.0.1"
        self.user = SUPERUSER
        self.password = PASSWORD
        self._run_as: str | None = None
        self.root = Path(tempfile.mkdtemp(prefix="mlpa-pg-"))
        self.data_dir = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log_file = self.root / "server.log"

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> "ThrowawayPostgres":
        try:
            self.init()
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

    def init(self) -> None:
        self.socket_dir.mkdir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            self._run_as = next(u for u in UNPRIVILEGED_USERS if _user_exists(u))
            account = pwd.getpwnam(self._run_as)
            for path in (self.root, self.socket_dir, pwfile):
                os.chown(path, account.pw_uid, account.pw_gid)
        self._run(
            "initdb",
            "-D", str(self.data_dir),
            "-U", self.user,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )  # fmt: skip
        pwfile.unlink()

    def start(self) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.socket_dir}",
                f"-c listen_addresses={self.host}",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-o", options, "start")

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def is_running(self) -> bool:
        result = self._run("pg_ctl", "-D", str(self.data_dir), "status", check=False)
        return result.returncode == 0

    def destroy(self) -> None:
        if self.data_dir.exists() and self.is_running():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, binary: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / binary), *args]
        if self._run_as is not None:
            command = ["runuser", "-u", self._run_as, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.root)
        if check and result.returncode != 0:
            log_tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise RuntimeError(
                f"{binary} failed ({result.returncode}): {result.stderr.strip()}\n{log_tail}".rstrip()
            )
        return result

    # -- connection settings -------------------------------------------------------
    def settings(self, **overrides: object) -> PostgresSettings:
        base = PostgresSettings(
            host=self.host,
            port=self.port,
            username=self.user,
            password=self.password,
            litellm_db_name="litellm",
            app_attest_db_name="app_attest",
            pool_min_size=1,
            pool_max_size=10,
        )
        return replace(base, **overrides)  # type: ignore[arg-type]


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# -- databases ---------------------------------------------------------------------


async def create_litellm_database(pg: PostgresSettings) -> None:
    """The `litellm` database with the two LiteLLM tables MLPA touches."""
    admin = await asyncpg.connect(
        host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=MAINTENANCE_DB
    )
    try:
        if not await admin.fetchval("SELECT true FROM pg_database WHERE datname = $1", pg.litellm_db_name):
            await admin.execute(f"CREATE DATABASE {quote_ident(pg.litellm_db_name)}")
    finally:
        await admin.close()
    conn = await asyncpg.connect(
        host=pg.host, port=pg.port, user=pg.username, password=pg.password, database=pg.litellm_db_name
    )
    try:
        await conn.execute(LITELLM_SCHEMA)
    finally:
        await conn.close()


async def prepare_databases(pg: PostgresSettings, *, max_signed_in_users: int = 1_000_000) -> list[str]:
    """LiteLLM's schema plus the app migrations; returns the migrations applied."""
    await create_litellm_database(pg)
    settings = Settings(postgres=pg)
    settings = replace(settings, signup_cap=replace(settings.signup_cap, max_signed_in_users=max_signed_in_users))
    # The throwaway server's superuser keeps its defaults (no role-level timeouts).
    return await migrate(settings, role_timeouts=False)


async def truncate_all(litellm_pool: asyncpg.Pool, app_pool: asyncpg.Pool) -> None:
    """Per-test isolation: empty every table both stores use."""
    await litellm_pool.execute(f"TRUNCATE {', '.join(LITELLM_TABLES)}")
    await app_pool.execute(f"TRUNCATE {', '.join(APP_TABLES)}")


class LiteLLMTableCustomerCreator:
    """Creates end users the way LiteLLM's `/customer/new` does: a row, duplicates ignored.

    Usable as a `CustomerCreator` and as the fake LiteLLM's `customer_sink` hook.
    """

    def __init__(self, litellm_pool: asyncpg.Pool) -> None:
        self._pool = litellm_pool
        self.calls: list[tuple[str, str]] = []

    async def create_customer(self, user_id: str, budget_id: str) -> None:
        self.calls.append((user_id, budget_id))
        await self._pool.execute(
            'INSERT INTO "LiteLLM_EndUserTable" (user_id, budget_id, blocked, spend)'
            " VALUES ($1, $2, false, 0) ON CONFLICT (user_id) DO NOTHING",
            user_id,
            budget_id,
        )

    async def __call__(self, user_id: str, budget_id: str) -> None:
        await self.create_customer(user_id, budget_id)
