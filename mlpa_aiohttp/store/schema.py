"""Is the app database's schema the one this release ships? Read at start and by readiness.

`migrate` (store/migrate.py) records each applied file in `schema_migrations`; this compares
that table with the package's `migrations/*.sql`:

* missing: shipped here, not applied. The code may use a table or column that is not there,
  so the pod is not ready until `migrate` has run; readiness re-reads the table (one small
  query) while anything is missing, so the Job finishing makes the pod ready without a
  restart. Once nothing is missing the check stops: a later release's migration never
  takes a serving pod out.
* unknown: applied, not shipped here (the database is ahead: a newer release migrated it,
  and this pod is an older one, in a rolling update or a rollback). Migrations only add, so
  older code runs on a newer schema: reported once, readiness unaffected
  (compatibility.md D62).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import structlog

from .migrate import load_migrations
from .pools import DATABASE_ERRORS

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SchemaDifference:
    missing: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Every shipped migration is applied (unknown ones do not count)."""
        return not self.missing

    def body(self) -> dict[str, list[str]]:
        return {"missing": list(self.missing), "unknown": list(self.unknown)}


def compare(applied: set[str], shipped: Sequence[str]) -> SchemaDifference:
    return SchemaDifference(
        missing=tuple(version for version in shipped if version not in applied),
        unknown=tuple(sorted(applied - set(shipped))),
    )


async def applied_versions(pool: asyncpg.Pool) -> set[str]:
    """The versions `schema_migrations` records; none when `migrate` never ran."""
    async with pool.acquire() as conn:
        if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
            return set()
        return {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}


class SchemaWatch:
    """The app database's schema as readiness sees it."""

    def __init__(self, pool: asyncpg.Pool, database: str, shipped: Sequence[str] | None = None) -> None:
        self._pool = pool
        self._database = database
        self._shipped = tuple(shipped if shipped is not None else (m.version for m in load_migrations()))
        self.difference = SchemaDifference()

    async def check_at_start(self) -> SchemaDifference:
        """Compare once and say what differs: ERROR while a shipped migration is missing,
        WARNING for a database ahead of this release. Raises the store's errors at start."""
        self.difference = compare(await applied_versions(self._pool), self._shipped)
        fields = {"database": self._database, **self.difference.body()}
        if self.difference.missing:
            log.error(
                "app_database_schema_behind",
                hint="run `python -m mlpa_aiohttp migrate` (the migration Job); this pod stays unready until then",
                **fields,
            )
        elif self.difference.unknown:
            log.warning("app_database_schema_ahead", **fields)
        return self.difference

    async def ready(self, timeout: float) -> SchemaDifference:
        """The difference, read again while something is missing (bounded by `timeout`; a
        failed read keeps the last answer: the database pings report the outage)."""
        if self.difference.complete:
            return self.difference
        try:
            applied = await asyncio.wait_for(applied_versions(self._pool), timeout)
        except DATABASE_ERRORS as exc:
            log.warning("readiness_schema_check_failed", error_type=type(exc).__name__)
            return self.difference
        before, self.difference = self.difference, compare(applied, self._shipped)
        if self.difference.complete and not before.complete:
            log.info("app_database_schema_current", database=self._database, applied=list(before.missing))
        return self.difference
