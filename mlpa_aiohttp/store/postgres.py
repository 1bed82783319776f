"""The production `UserStore`: LiteLLM's own tables plus the app database (compatibility.md §3, §8).

End users are read from and updated in `"LiteLLM_EndUserTable"` directly, but only ever
*created* through LiteLLM's `/customer/new` (the injected `CustomerCreator`). The signup
cap lives in `capacity.SignupCapacity`. Every database failure leaves as
`StoreUnavailable`; nothing here holds a connection or transaction past a cancellation.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import logging
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import asyncpg

from ..catalog import BudgetTier
from ..settings import PostgresSettings, Settings
from ..wire import is_identifier
from .base import (
    Admission,
    BudgetMissing,
    BudgetUsage,
    CapacityState,
    CustomerCreator,
    EndUser,
    StoreUnavailable,
    require_identifier,
)
from .capacity import SignupCapacity
from .pools import DATABASE_ERRORS, Budgets, Pools, db_errors, retry_stale, transaction

log = logging.getLogger(__name__)
T = TypeVar("T")

# LiteLLM's tables: the names are quoted because LiteLLM created them mixed-case.
_SELECT_USER = 'SELECT * FROM "LiteLLM_EndUserTable" WHERE user_id = $1'

# The caller's own row only (the id is the authenticated identity), with its budget's limits.
_SELECT_USAGE = """
SELECT u.spend, u.blocked, u.budget_id, b.max_budget, b.budget_duration, b.budget_reset_at, b.tpm_limit, b.rpm_limit
FROM "LiteLLM_EndUserTable" u
LEFT JOIN "LiteLLM_BudgetTable" b ON b.budget_id = u.budget_id
WHERE u.user_id = $1
"""

# LiteLLM's timestamps are `timestamp(3)` without a zone, written in UTC whatever the
# session's TimeZone: `now()` converted to UTC, as LiteLLM writes them. The author is the
# name LiteLLM's own budget endpoints write for its admin.
_UPSERT_BUDGET = """
INSERT INTO "LiteLLM_BudgetTable"
    (budget_id, max_budget, rpm_limit, tpm_limit, budget_duration,
     created_at, updated_at, created_by, updated_by)
VALUES ($1, $2, $3, $4, $5, timezone('UTC', now()), timezone('UTC', now()), 'default_user_id', 'default_user_id')
ON CONFLICT (budget_id) DO UPDATE SET
    max_budget = EXCLUDED.max_budget,
    rpm_limit = EXCLUDED.rpm_limit,
    tpm_limit = EXCLUDED.tpm_limit,
    budget_duration = EXCLUDED.budget_duration,
    updated_at = EXCLUDED.updated_at,
    updated_by = EXCLUDED.updated_by
"""

_BUDGET_EXISTS = 'SELECT EXISTS (SELECT 1 FROM "LiteLLM_BudgetTable" WHERE budget_id = $1)'

# Only an unset budget is given back: a budget an operator chose stays.
_RELINK_USER = (
    'UPDATE "LiteLLM_EndUserTable" SET budget_id = $2 WHERE user_id = $1 AND budget_id IS NULL RETURNING *'
)

# Every user of a service type (the part of its id after the first ':', as provisioning reads
# it) whose budget is unset gets that type's budget: one pass over the table for all types.
_RELINK_ALL = """
WITH relinked AS (
    UPDATE "LiteLLM_EndUserTable" AS u SET budget_id = t.budget_id
    FROM unnest($1::text[], $2::text[]) AS t(service_type, budget_id)
    WHERE u.budget_id IS NULL
      AND strpos(u.user_id, ':') > 0
      AND substr(u.user_id, strpos(u.user_id, ':') + 1) = t.service_type
    RETURNING t.service_type
)
SELECT service_type, count(*) AS relinked FROM relinked GROUP BY service_type
"""


def json_ready(value: Any) -> Any:
    """A column value as something `json.dumps` accepts (the admin API returns rows)."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    return value


def _as_utc(value: datetime.datetime | None) -> datetime.datetime | None:
    """LiteLLM's own migration makes timestamps `timestamp(3)` without a zone, written in UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=datetime.UTC)
    return value


async def _refused_budget_raises(write: Awaitable[T]) -> T:
    """A write of a budget id, with LiteLLM's foreign key refusing it as `BudgetMissing`."""
    try:
        return await write
    except asyncpg.ForeignKeyViolationError:
        raise BudgetMissing() from None


def record_dict(row: asyncpg.Record) -> dict[str, Any]:
    return {key: json_ready(value) for key, value in row.items()}


def end_user(row: asyncpg.Record) -> EndUser:
    record = record_dict(row)
    return EndUser(
        user_id=record["user_id"],
        budget_id=record.get("budget_id"),
        blocked=bool(record.get("blocked")),
        record=record,
    )


class PostgresUserStore:
    backend = "postgres"

    def __init__(
        self,
        pools: Pools,
        customers: CustomerCreator,
        pg: PostgresSettings,
        *,
        admission_lock_timeout_ms: int = 5000,
    ) -> None:
        self._pools = pools
        self._customers = customers
        self._pg = pg
        self._budgets = Budgets.from_settings(pg, admission_lock_timeout_ms)
        self._capacity = SignupCapacity(pools.app, pools.litellm, self._budgets)

    @classmethod
    def from_settings(cls, pools: Pools, customers: CustomerCreator, settings: Settings) -> PostgresUserStore:
        return cls(
            pools,
            customers,
            settings.postgres,
            admission_lock_timeout_ms=settings.signup_cap.admission_lock_timeout_ms,
        )

    # -- end users -----------------------------------------------------------------
    async def get_user(self, user_id: str) -> EndUser | None:
        if not is_identifier(user_id):
            return None  # never stored (PostgreSQL would refuse a NUL in the query)
        # Hot path: one autocommit statement under the session's default budget.
        row = await retry_stale("get_user", lambda: self._pools.litellm.fetchrow(_SELECT_USER, user_id))
        return None if row is None else end_user(row)

    async def create_user(self, user_id: str, budget_id: str) -> EndUser | None:
        require_identifier(user_id)
        await self._customers.create_customer(user_id, budget_id)
        return await self.get_user(user_id)

    async def relink_budget(self, user_id: str, budget_id: str) -> EndUser | None:
        row = await retry_stale(
            "relink_budget", lambda: _refused_budget_raises(self._pools.litellm.fetchrow(_RELINK_USER, user_id, budget_id))
        )
        return None if row is None else end_user(row)

    async def get_usage(self, user_id: str) -> BudgetUsage | None:
        if not is_identifier(user_id):
            return None  # never stored, as in get_user
        row = await retry_stale("get_usage", lambda: self._pools.litellm.fetchrow(_SELECT_USAGE, user_id))
        if row is None:
            return None
        return BudgetUsage(
            spend=float(row["spend"] or 0.0),
            blocked=bool(row["blocked"]),
            budget_id=row["budget_id"],
            max_budget=None if row["max_budget"] is None else float(row["max_budget"]),
            budget_duration=row["budget_duration"],
            budget_reset_at=_as_utc(row["budget_reset_at"]),
            tpm_limit=None if row["tpm_limit"] is None else int(row["tpm_limit"]),
            rpm_limit=None if row["rpm_limit"] is None else int(row["rpm_limit"]),
        )

    # -- signup cap ----------------------------------------------------------------
    async def admit(self, base_identity: str) -> Admission:
        return await self._capacity.admit(base_identity)

    async def release(self, base_identity: str, capped: frozenset[str]) -> None:
        await self._capacity.release(base_identity, capped)

    async def capacity_state(self) -> CapacityState | None:
        return await self._capacity.state()

    # -- startup -------------------------------------------------------------------
    async def ensure_budgets(self, budgets: Mapping[str, BudgetTier]) -> Mapping[str, int]:
        # As in the reference: one tier failing must not keep the others out.
        written: dict[str, str] = {}
        for service_type, tier in budgets.items():
            try:
                await self.restore_budget(tier)
            except StoreUnavailable as exc:
                log.error("budget upsert failed for %s (%s): %s", service_type, tier.budget_id, exc)
            else:
                written[service_type] = tier.budget_id
        if not written:
            return {}
        try:
            async with transaction(self._pools.litellm, self._budgets.maintenance) as conn:
                rows = await conn.fetch(_RELINK_ALL, list(written), list(written.values()))
        except DATABASE_ERRORS as exc:
            log.error("budget relink at start failed: %s", exc)
            return {}
        return {row["service_type"]: int(row["relinked"]) for row in rows}

    async def restore_budget(self, tier: BudgetTier) -> None:
        with db_errors("restore_budget"):
            async with transaction(self._pools.litellm, self._budgets.default) as conn:
                await conn.execute(
                    _UPSERT_BUDGET, tier.budget_id, tier.max_budget, tier.rpm_limit, tier.tpm_limit, tier.budget_duration
                )

    async def budget_exists(self, budget_id: str) -> bool:
        return bool(await retry_stale("budget_exists", lambda: self._pools.litellm.fetchval(_BUDGET_EXISTS, budget_id)))

    async def ensure_capacity_state(self, max_identities: int, capped: frozenset[str]) -> None:
        await self._capacity.seed(max_identities)
        try:
            count = await self._capacity.reconcile(capped)
        except Exception as exc:  # noqa: BLE001 - best effort: a stale count is better than no service
            log.error("signup capacity reconciliation failed: %s", exc)
        else:
            log.info("signup capacity reconciled: %d managed identities", count)

    # -- admin ---------------------------------------------------------------------
    async def list_users(self, limit: int, offset: int) -> tuple[list[Mapping[str, Any]], int]:
        async def read() -> tuple[list[Mapping[str, Any]], int]:
            async with transaction(self._pools.litellm, self._budgets.admin_read) as conn:
                total = await conn.fetchval('SELECT COUNT(*) FROM "LiteLLM_EndUserTable"')
                rows = await conn.fetch(
                    'SELECT * FROM "LiteLLM_EndUserTable" ORDER BY user_id LIMIT $1 OFFSET $2', limit, offset
                )
            return [record_dict(r) for r in rows], int(total)

        return await retry_stale("list_users", read)

    async def counts_by_service_type(self) -> dict[str, int]:
        async def read() -> dict[str, int]:
            async with transaction(self._pools.litellm, self._budgets.admin_read) as conn:
                rows = await conn.fetch(
                    "SELECT split_part(user_id, ':', 2) AS service_type, COUNT(*) AS n"
                    ' FROM "LiteLLM_EndUserTable" WHERE position(\':\' in user_id) > 0 GROUP BY 1'
                )
            return {r["service_type"]: int(r["n"]) for r in rows}

        return await retry_stale("counts_by_service_type", read)

    # Both updates set absolute values, so a retry after a dropped connection is safe.
    async def set_budget(self, user_id: str, budget_id: str) -> EndUser | None:
        if not is_identifier(user_id):
            return None
        row = await retry_stale(
            "set_budget",
            lambda: _refused_budget_raises(
                self._pools.litellm.fetchrow(
                    'UPDATE "LiteLLM_EndUserTable" SET budget_id = $2 WHERE user_id = $1 RETURNING *', user_id, budget_id
                )
            ),
        )
        return None if row is None else end_user(row)

    async def set_blocked(self, user_id: str, blocked: bool) -> EndUser | None:
        if not is_identifier(user_id):
            return None
        row = await retry_stale(
            "set_blocked",
            lambda: self._pools.litellm.fetchrow(
                'UPDATE "LiteLLM_EndUserTable" SET blocked = $2 WHERE user_id = $1 RETURNING *', user_id, blocked
            ),
        )
        return None if row is None else end_user(row)

    # -- health --------------------------------------------------------------------
    async def ping(self) -> dict[str, bool]:
        litellm, app = await asyncio.gather(self._ping(self._pools.litellm), self._ping(self._pools.app))
        return {"postgres": litellm, "app_attest": app}

    async def _ping(self, pool: asyncpg.Pool) -> bool:
        try:
            async with asyncio.timeout(self._pg.readiness_check_timeout_s):
                return await pool.fetchval("SELECT 1") == 1
        except DATABASE_ERRORS:
            return False
