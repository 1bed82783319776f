"""asyncpg pools for the two databases, and the per-transaction timeout budgets.

One pool per database: LiteLLM's (`LITELLM_DB_NAME`, end users and budgets) and the app's
(`APP_ATTEST_DB_NAME`, App Attest state and the signup cap). Session settings are sent at
connect time; every transaction that needs a different budget sets it with `SET LOCAL`,
which also works behind PgBouncer in transaction-pooling mode (where connect-time
settings never reach the backend; use `PG_PREPARED_STMT_CACHE_MAX_SIZE=0` there).

Errors: a database unreachable at startup raises `DatabaseConnectError` naming host, port
and database. Later failures (server gone, timeouts, lock timeouts) are converted to
`StoreUnavailable` by `db_errors`; asyncpg replaces broken connections on the next
acquire, so the pools recover without help once the server is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from ..settings import PostgresSettings
from .base import StoreUnavailable

# How long one connection attempt may take (asyncpg's default is 60 s, far too long
# for a pod that should fail its start and be restarted).
CONNECT_TIMEOUT_S = 10.0

# Errors that mean "the database did not do it", as opposed to our own bugs.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)

# What a pooled connection reports when the server dropped it while it sat idle
# (backend terminated, server or PgBouncer restarted).
STALE_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.AdminShutdownError,
    asyncpg.InternalClientError,
    ConnectionResetError,
    BrokenPipeError,
)

T = TypeVar("T")

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH_CODES = frozenset({62, 64})


class DatabaseConnectError(StoreUnavailable):
    """A database could not be reached when the pools were opened."""


def connect_error(pg: PostgresSettings, database: str, exc: BaseException) -> DatabaseConnectError:
    """What a failed connection says at start: where, who, why (no password), and for a
    certificate the server failed, which setting it failed."""
    message = (
        f"cannot connect to PostgreSQL at {pg.host}:{pg.port}, database {database!r}, "
        f"user {pg.username!r}: {type(exc).__name__}: {exc}"
    )
    if isinstance(exc, ssl.SSLCertVerificationError):
        trusted = f"DB_SSL_ROOT_CERT ({pg.tls.root_cert})" if pg.tls.root_cert else "the system's trust store"
        if exc.verify_code in _NAME_MISMATCH_CODES:
            message += f"; with DB_SSL_MODE={pg.tls.mode} the server's certificate must name DB_HOST ({pg.host})"
        else:
            message += f"; with DB_SSL_MODE={pg.tls.mode} the server's certificate must chain to {trusted}"
    elif "rejected SSL upgrade" in str(exc):
        message += f"; DB_SSL_MODE={pg.tls.mode} needs a server with TLS on"
    return DatabaseConnectError(message)


@dataclass(frozen=True, slots=True)
class TimeoutBudget:
    """Server-side limits for one transaction, applied with `SET LOCAL`."""

    statement_ms: int
    idle_in_tx_ms: int
    lock_ms: int | None = None

    def set_local_sql(self) -> str:
        # SET cannot take bind parameters; the values are ints from our own settings.
        parts = [
            f"SET LOCAL statement_timeout = {int(self.statement_ms)}",
            f"SET LOCAL idle_in_transaction_session_timeout = {int(self.idle_in_tx_ms)}",
        ]
        if self.lock_ms is not None:
            parts.append(f"SET LOCAL lock_timeout = {int(self.lock_ms)}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Budgets:
    """The named timeout budgets of compatibility.md §8.2, derived from the settings."""

    default: TimeoutBudget
    admin_read: TimeoutBudget
    maintenance: TimeoutBudget
    admission: TimeoutBudget

    @classmethod
    def from_settings(cls, pg: PostgresSettings, admission_lock_timeout_ms: int) -> Budgets:
        def raised(statement_ms: int) -> TimeoutBudget:
            # The idle-in-transaction limit must not cut a transaction the statement
            # limit still allows.
            return TimeoutBudget(statement_ms, max(statement_ms, pg.idle_in_tx_timeout_ms))

        # Admission waits on the global row lock first; the lock wait is governed by
        # lock_timeout, so the statement limit is the lock budget plus the normal one.
        admission_ms = admission_lock_timeout_ms + pg.statement_timeout_ms
        return cls(
            default=TimeoutBudget(pg.statement_timeout_ms, pg.idle_in_tx_timeout_ms),
            admin_read=raised(pg.admin_read_timeout_ms),
            maintenance=raised(pg.maintenance_statement_timeout_ms),
            admission=TimeoutBudget(admission_ms, admission_ms, lock_ms=admission_lock_timeout_ms),
        )


@dataclass(frozen=True, slots=True)
class Pools:
    litellm: asyncpg.Pool
    app: asyncpg.Pool


@contextlib.contextmanager
def db_errors(operation: str) -> Iterator[None]:
    """Turn driver and socket errors into `StoreUnavailable` (cancellation passes through)."""
    try:
        yield
    except DATABASE_ERRORS as exc:
        raise StoreUnavailable(f"{operation}: {type(exc).__name__}: {exc}") from exc


async def retry_stale(operation: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Run an idempotent database operation, once more on a fresh connection if the
    first one turns out to have been dropped by the server; errors as `StoreUnavailable`."""
    with db_errors(operation):
        try:
            return await attempt()
        except STALE_CONNECTION_ERRORS:
            return await attempt()


@contextlib.asynccontextmanager
async def transaction(pool: asyncpg.Pool, budget: TimeoutBudget) -> AsyncIterator[asyncpg.Connection]:
    """A connection inside a transaction with `budget` applied.

    asyncpg rolls the transaction back and returns the connection (the release is
    shielded) even when the awaiting task is cancelled, so nothing stays held.
    """
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(budget.set_local_sql())
        yield conn


def _server_settings(pg: PostgresSettings, db_name: str) -> dict[str, str]:
    return {
        "statement_timeout": f"{pg.statement_timeout_ms}ms",
        "idle_in_transaction_session_timeout": f"{pg.idle_in_tx_timeout_ms}ms",
        "application_name": f"mlpa:{db_name}",
    }


async def create_pool(pg: PostgresSettings, db_name: str) -> asyncpg.Pool:
    """Open one pool; raises `DatabaseConnectError` (no password in the message)."""
    try:
        pool = await asyncpg.create_pool(
            host=pg.host,
            port=pg.port,
            user=pg.username,
            password=pg.password,
            database=db_name,
            min_size=pg.pool_min_size,
            max_size=pg.pool_max_size,
            statement_cache_size=pg.prepared_stmt_cache_max_size,
            command_timeout=pg.command_timeout_s,
            server_settings=_server_settings(pg, db_name),
            timeout=CONNECT_TIMEOUT_S,
            ssl=pg.tls.ssl_argument(),
        )
    except DATABASE_ERRORS as exc:
        raise connect_error(pg, db_name, exc) from exc
    assert pool is not None
    return pool


@contextlib.asynccontextmanager
async def open_pools(pg: PostgresSettings) -> AsyncIterator[Pools]:
    """Both pools, closed on exit (gracefully, then terminated if that takes too long)."""
    litellm = await create_pool(pg, pg.litellm_db_name)
    try:
        app = await create_pool(pg, pg.app_attest_db_name)
        try:
            yield Pools(litellm=litellm, app=app)
        finally:
            await close_pool(app)
    finally:
        await close_pool(litellm)


_CLOSE_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *DATABASE_ERRORS)


async def close_pool(pool: asyncpg.Pool, timeout_s: float = 10.0) -> None:
    try:
        await asyncio.wait_for(pool.close(), timeout_s)
    except _CLOSE_ERRORS:
        pool.terminate()
