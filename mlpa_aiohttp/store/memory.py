"""In-process user store for the demo and tests (`MLPA_STORE=memory`).

Same contract as the Postgres store: users are created through LiteLLM's `/customer/new`
(so the demo's fake LiteLLM sees the call), a budget id needs its budget (as LiteLLM's
foreign key requires a row), and the signup cap is a set of claimed base identities guarded
by one lock. Nothing survives a restart.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..catalog import BudgetTier
from .base import (
    Admission,
    BudgetMissing,
    BudgetUsage,
    CapacityState,
    CapacityStateMissing,
    CustomerCreator,
    EndUser,
    require_identifier,
)


def _now() -> datetime:
    return datetime.now(UTC)


class MemoryUserStore:
    backend = "memory"

    def __init__(self, customers: CustomerCreator) -> None:
        self._customers = customers
        self._users: dict[str, dict[str, Any]] = {}
        self._budgets: dict[str, BudgetTier] = {}
        # LiteLLM's budget_reset_at per budget id; nothing resets budgets in memory.
        self._budget_resets: dict[str, datetime] = {}
        self._claims: set[str] = set()
        self._capacity: CapacityState | None = None
        self._lock = asyncio.Lock()

    # -- end users -----------------------------------------------------------------
    async def get_user(self, user_id: str) -> EndUser | None:
        row = self._users.get(user_id)
        return None if row is None else _end_user(row)

    async def create_user(self, user_id: str, budget_id: str) -> EndUser | None:
        require_identifier(user_id)
        await self._customers.create_customer(user_id, budget_id)
        # The Postgres store re-reads LiteLLM's table here; in memory we record the row
        # LiteLLM would have written (a concurrent creator's row stays; LiteLLM refuses a
        # budget with no row).
        row = self._users.get(user_id)
        if row is None:
            if budget_id not in self._budgets:
                return None
            row = self._users[user_id] = {
                "user_id": user_id, "alias": None, "spend": 0.0, "budget_id": budget_id, "blocked": False,
            }  # fmt: skip
        return _end_user(row)

    async def relink_budget(self, user_id: str, budget_id: str) -> EndUser | None:
        row = self._users.get(user_id)
        if row is None or row.get("budget_id") is not None:
            return None
        if budget_id not in self._budgets:
            raise BudgetMissing()
        row["budget_id"] = budget_id
        return _end_user(row)

    async def get_usage(self, user_id: str) -> BudgetUsage | None:
        row = self._users.get(user_id)
        if row is None:
            return None
        budget_id = row.get("budget_id")
        tier = self._budgets.get(budget_id) if budget_id is not None else None
        return BudgetUsage(
            spend=float(row.get("spend") or 0.0),
            blocked=bool(row.get("blocked")),
            budget_id=budget_id,
            max_budget=tier.max_budget if tier else None,
            budget_duration=tier.budget_duration if tier else None,
            budget_reset_at=self._budget_resets.get(budget_id) if tier and budget_id is not None else None,
            tpm_limit=tier.tpm_limit if tier else None,
            rpm_limit=tier.rpm_limit if tier else None,
        )

    async def add_spend(self, user_id: str, cost: float) -> None:
        """LiteLLM's spend update after a completion: the demo's fake LiteLLM calls it, as
        real LiteLLM updates the end-user table the Postgres store reads."""
        row = self._users.get(user_id)
        if row is not None:
            row["spend"] = float(row.get("spend") or 0.0) + cost

    # -- signup cap ----------------------------------------------------------------
    async def admit(self, base_identity: str) -> Admission:
        async with self._lock:
            if self._capacity is None:
                raise CapacityStateMissing()
            if base_identity in self._claims:
                return Admission(admitted=True, newly_claimed=False)
            if self._capacity.current_identities >= self._capacity.max_identities:
                return Admission(admitted=False, newly_claimed=False)
            self._claims.add(base_identity)
            self._set_current(self._capacity.current_identities + 1)
            return Admission(admitted=True, newly_claimed=True)

    async def release(self, base_identity: str, capped: frozenset[str]) -> None:
        if self._has_capped_user(base_identity, capped):
            return
        async with self._lock:
            if self._capacity is not None and base_identity in self._claims:
                self._claims.discard(base_identity)
                self._set_current(max(0, self._capacity.current_identities - 1))

    async def capacity_state(self) -> CapacityState | None:
        return self._capacity

    def _set_current(self, current: int) -> None:
        assert self._capacity is not None
        self._capacity = CapacityState(self._capacity.max_identities, current, _now())

    def _has_capped_user(self, base_identity: str, capped: frozenset[str]) -> bool:
        return any(f"{base_identity}:{st}" in self._users for st in capped)

    # -- startup -------------------------------------------------------------------
    async def ensure_budgets(self, budgets: Mapping[str, BudgetTier]) -> Mapping[str, int]:
        self._budgets = {tier.budget_id: tier for tier in budgets.values()}
        relinked: Counter[str] = Counter()
        for row in self._users.values():
            _, _, service_type = row["user_id"].partition(":")
            if row.get("budget_id") is None and service_type in budgets:
                row["budget_id"] = budgets[service_type].budget_id
                relinked[service_type] += 1
        return dict(relinked)

    async def restore_budget(self, tier: BudgetTier) -> None:
        self._budgets[tier.budget_id] = tier

    async def budget_exists(self, budget_id: str) -> bool:
        return budget_id in self._budgets

    async def ensure_capacity_state(self, max_identities: int, capped: frozenset[str]) -> None:
        capped_values = set(capped)
        async with self._lock:
            self._claims = {
                base
                for base, _, suffix in (uid.partition(":") for uid in self._users)
                if suffix in capped_values
            }
            self._capacity = CapacityState(max_identities, len(self._claims), _now())

    # -- admin ---------------------------------------------------------------------
    async def list_users(self, limit: int, offset: int) -> tuple[list[Mapping[str, Any]], int]:
        ordered: list[Mapping[str, Any]] = [dict(self._users[k]) for k in sorted(self._users)]
        return ordered[offset : offset + limit], len(ordered)

    async def counts_by_service_type(self) -> dict[str, int]:
        counts = Counter(uid.split(":")[1] for uid in self._users if ":" in uid)
        return dict(counts)

    async def set_budget(self, user_id: str, budget_id: str) -> EndUser | None:
        row = self._users.get(user_id)
        if row is None:
            return None
        if budget_id not in self._budgets:
            raise BudgetMissing()
        row["budget_id"] = budget_id
        return _end_user(row)

    async def set_blocked(self, user_id: str, blocked: bool) -> EndUser | None:
        row = self._users.get(user_id)
        if row is None:
            return None
        row["blocked"] = blocked
        return _end_user(row)

    async def ping(self) -> dict[str, bool]:
        return {"postgres": True, "app_attest": True}


def _end_user(row: Mapping[str, Any]) -> EndUser:
    return EndUser(
        user_id=row["user_id"],
        budget_id=row.get("budget_id"),
        blocked=bool(row.get("blocked")),
        record=dict(row),
    )
