"""What the service needs from a user store: LiteLLM end users, budgets, the signup cap.

Two implementations honour this contract: `memory.MemoryUserStore` (demo, tests) and
`postgres.PostgresUserStore` (production: LiteLLM's own tables plus the app database).
One contract test suite runs against both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from ..catalog import BudgetTier
from ..wire import is_identifier

# Readiness reports this for the databases a memory store does not use (the demo).
MEMORY_STORE_STATE = "not used (MLPA_STORE=memory)"

class InvalidIdentifier(ValueError):
    """A user id the wire rules refuse (control characters, lone surrogates): it is never
    stored, so lookups find nothing and creation refuses it."""


def require_identifier(user_id: str) -> None:
    if not is_identifier(user_id):
        raise InvalidIdentifier("user id has control characters or lone surrogates")


class StoreUnavailable(Exception):
    """The backing database failed (down, timed out, lock timeout)."""


class CapacityStateMissing(Exception):
    """The signup-capacity row was never seeded (run the migrations)."""


class BudgetMissing(Exception):
    """LiteLLM's foreign key refused a budget id: its row in `"LiteLLM_BudgetTable"` is gone
    (deleted through LiteLLM's budget API, or never created)."""


@dataclass(frozen=True, slots=True)
class EndUser:
    user_id: str
    budget_id: str | None
    blocked: bool
    # The whole LiteLLM row, JSON-ready, for the admin API.
    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class BudgetUsage:
    """One end user's spend and the limits of its budget (`GET /v1/usage`). The budget
    fields are None when the user has no budget or its budget row is missing."""

    spend: float
    blocked: bool
    budget_id: str | None
    max_budget: float | None
    budget_duration: str | None
    # When LiteLLM next resets the budget's spend; None until LiteLLM has set it.
    budget_reset_at: datetime | None
    tpm_limit: int | None
    rpm_limit: int | None


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    newly_claimed: bool


@dataclass(frozen=True, slots=True)
class CapacityState:
    max_identities: int
    current_identities: int
    updated_at: datetime | None


class CustomerCreator(Protocol):
    """The part of the LiteLLM client a store needs: `POST /customer/new`."""

    async def create_customer(self, user_id: str, budget_id: str) -> None: ...


class UserStore(Protocol):
    # -- end users -----------------------------------------------------------------
    async def get_user(self, user_id: str) -> EndUser | None: ...

    async def create_user(self, user_id: str, budget_id: str) -> EndUser | None:
        """Ask LiteLLM to create the end user (its status is ignored, so a concurrent
        duplicate is harmless), then re-read; None when the user still does not exist."""
        ...

    async def relink_budget(self, user_id: str, budget_id: str) -> EndUser | None:
        """Give a user whose budget is unset (LiteLLM's foreign key sets it NULL when the
        budget row is deleted) `budget_id`; None when it had one (or no longer exists).
        Raises `BudgetMissing` when that budget's row is gone too."""
        ...

    async def get_usage(self, user_id: str) -> BudgetUsage | None:
        """The user's spend joined with its budget's limits; None when the user does not
        exist. Reads one user only: the id is the authenticated caller's own."""
        ...

    # -- signup cap (called only when enforcement is on) ----------------------------
    async def admit(self, base_identity: str) -> Admission:
        """Claim a slot for a base identity under the global lock; raises
        `CapacityStateMissing` when the capacity row is absent."""
        ...

    async def release(self, base_identity: str, capped: frozenset[str]) -> None:
        """Give the slot back unless the identity has a user row of a capped type."""
        ...

    async def capacity_state(self) -> CapacityState | None: ...

    # -- startup -------------------------------------------------------------------
    async def ensure_budgets(self, budgets: Mapping[str, BudgetTier]) -> Mapping[str, int]:
        """Write each service type's budget row (as LiteLLM writes its own), then relink the
        users of each type whose budget is unset; returns how many per service type. A tier
        that fails is logged and skipped: the others still get written."""
        ...

    async def restore_budget(self, tier: BudgetTier) -> None:
        """Write one tier's budget row again (raises `StoreUnavailable`)."""
        ...

    async def budget_exists(self, budget_id: str) -> bool: ...

    async def ensure_capacity_state(self, max_identities: int, capped: frozenset[str]) -> None: ...

    # -- admin ---------------------------------------------------------------------
    async def list_users(self, limit: int, offset: int) -> tuple[list[Mapping[str, Any]], int]: ...

    async def counts_by_service_type(self) -> dict[str, int]: ...

    async def set_budget(self, user_id: str, budget_id: str) -> EndUser | None:
        """None when the user does not exist; raises `BudgetMissing` when the budget's row is gone."""
        ...

    async def set_blocked(self, user_id: str, blocked: bool) -> EndUser | None: ...

    # -- health --------------------------------------------------------------------
    # "postgres" or "memory": readiness reports the databases only where they are used.
    backend: str

    async def ping(self) -> dict[str, bool]:
        """Reachability per database, e.g. {"postgres": True, "app_attest": True}."""
        ...
