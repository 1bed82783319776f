"""The signup cap in SQL: the one piece of the store with lock semantics (compatibility.md §3.2).

State lives in the app database: the singleton row `mlpa_user_capacity(id = 1)` and one
claim row per admitted base identity in `mlpa_user_capacity_identities`. Every change to
the count happens in a transaction that first locks the singleton row `FOR UPDATE`, so
admissions, releases and reconciliations are serialised across all workers and pods.
Waiting for that lock is bounded by `lock_timeout`; a timeout surfaces as
`StoreUnavailable` (the caller answers 500), never as a hang.

Reads of LiteLLM's table (does this identity still have a capped user? which identities
have one?) run on the LiteLLM pool *before* the app transaction opens, so the global lock
is never held across a second database.
"""

from __future__ import annotations

import asyncpg

from .base import Admission, CapacityState, CapacityStateMissing
from .pools import Budgets, db_errors, retry_stale, transaction

_LOCK_ROW = "SELECT max_identities, current_identities FROM mlpa_user_capacity WHERE id = 1 FOR UPDATE"


def capped_user_ids(base_identity: str, capped: frozenset[str]) -> list[str]:
    return sorted(f"{base_identity}:{st}" for st in capped)


class SignupCapacity:
    def __init__(self, app_pool: asyncpg.Pool, litellm_pool: asyncpg.Pool, budgets: Budgets) -> None:
        self._app = app_pool
        self._litellm = litellm_pool
        self._budgets = budgets

    async def admit(self, base_identity: str) -> Admission:
        # Retried once on a dropped connection: the first attempt either never reached
        # the server, was rolled back, or committed (then the retry finds the claim).
        return await retry_stale("admit", lambda: self._admit(base_identity))

    async def _admit(self, base_identity: str) -> Admission:
        async with transaction(self._app, self._budgets.admission) as conn:
            row = await conn.fetchrow(_LOCK_ROW)
            if row is None:
                raise CapacityStateMissing()
            claimed = await conn.fetchval(
                "SELECT true FROM mlpa_user_capacity_identities WHERE base_identity = $1", base_identity
            )
            if claimed:
                return Admission(admitted=True, newly_claimed=False)
            if row["current_identities"] >= row["max_identities"]:
                return Admission(admitted=False, newly_claimed=False)
            await conn.execute("INSERT INTO mlpa_user_capacity_identities (base_identity) VALUES ($1)", base_identity)
            await conn.execute(
                "UPDATE mlpa_user_capacity"
                " SET current_identities = current_identities + 1, updated_at = NOW() WHERE id = 1"
            )
            return Admission(admitted=True, newly_claimed=True)

    async def release(self, base_identity: str, capped: frozenset[str]) -> None:
        if await self.has_capped_user(base_identity, capped):
            return
        await retry_stale("release", lambda: self._release(base_identity))

    async def _release(self, base_identity: str) -> None:
        async with transaction(self._app, self._budgets.admission) as conn:
            if await conn.fetchrow(_LOCK_ROW) is None:
                return
            deleted = await conn.fetchval(
                "DELETE FROM mlpa_user_capacity_identities WHERE base_identity = $1 RETURNING true", base_identity
            )
            if deleted:
                await conn.execute(
                    "UPDATE mlpa_user_capacity"
                    " SET current_identities = GREATEST(current_identities - 1, 0), updated_at = NOW()"
                    " WHERE id = 1"
                )

    async def has_capped_user(self, base_identity: str, capped: frozenset[str]) -> bool:
        async def read() -> bool:
            # Exact ids, so the primary key serves the lookup.
            async with transaction(self._litellm, self._budgets.admin_read) as conn:
                return bool(
                    await conn.fetchval(
                        'SELECT EXISTS (SELECT 1 FROM "LiteLLM_EndUserTable" WHERE user_id = ANY($1::text[]))',
                        capped_user_ids(base_identity, capped),
                    )
                )

        return await retry_stale("has_capped_user", read)

    async def state(self) -> CapacityState | None:
        row = await retry_stale(
            "capacity_state",
            lambda: self._app.fetchrow(
                "SELECT max_identities, current_identities, updated_at FROM mlpa_user_capacity WHERE id = 1"
            ),
        )
        if row is None:
            return None
        return CapacityState(row["max_identities"], row["current_identities"], row["updated_at"])

    async def seed(self, max_identities: int) -> None:
        """Create the row if absent and set the configured maximum (failure is fatal)."""
        async def seed() -> None:
            async with transaction(self._app, self._budgets.default) as conn:
                await seed_capacity_row(conn, max_identities)

        await retry_stale("seed capacity state", seed)

    async def reconcile(self, capped: frozenset[str]) -> int:
        """Rebuild the claims from LiteLLM's table; returns the new count.

        The LiteLLM read happens first, outside the app transaction; the rebuild then
        holds the singleton lock, so two pods starting together run one after the other
        and each leaves claims and count consistent.
        """
        with db_errors("reconcile capacity (read LiteLLM users)"):
            async with transaction(self._litellm, self._budgets.maintenance) as conn:
                rows = await conn.fetch(
                    "SELECT DISTINCT split_part(user_id, ':', 1) AS base_identity"
                    ' FROM "LiteLLM_EndUserTable"'
                    " WHERE position(':' in user_id) > 0"
                    "   AND substr(user_id, position(':' in user_id) + 1) = ANY($1::text[])",
                    sorted(st for st in capped),
                )
        identities = [r["base_identity"] for r in rows]
        with db_errors("reconcile capacity (rebuild claims)"):
            async with transaction(self._app, self._budgets.maintenance) as conn:
                if await conn.fetchrow(_LOCK_ROW) is None:
                    raise CapacityStateMissing()
                await conn.execute("DELETE FROM mlpa_user_capacity_identities")
                await conn.execute(
                    "INSERT INTO mlpa_user_capacity_identities (base_identity)"
                    " SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
                    identities,
                )
                return int(
                    await conn.fetchval(
                        "UPDATE mlpa_user_capacity SET current_identities ="
                        " (SELECT count(*) FROM mlpa_user_capacity_identities), updated_at = NOW()"
                        " WHERE id = 1 RETURNING current_identities"
                    )
                )


async def seed_capacity_row(conn: asyncpg.Connection, max_identities: int) -> None:
    """Shared by startup and `migrate`: one statement, safe when run concurrently."""
    await conn.execute(
        "INSERT INTO mlpa_user_capacity (id, max_identities, current_identities, updated_at)"
        " VALUES (1, $1, 0, NOW())"
        " ON CONFLICT (id) DO UPDATE SET max_identities = EXCLUDED.max_identities, updated_at = NOW()",
        max_identities,
    )
