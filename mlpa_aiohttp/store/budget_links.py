"""Every end user linked to its service type's budget row, whatever happened to that row.

LiteLLM's `"LiteLLM_EndUserTable".budget_id` is a foreign key to `"LiteLLM_BudgetTable"`
(ON DELETE SET NULL). A tier's row deleted through LiteLLM's budget API, or never written,
therefore means: creating a user of that tier fails, changing a user to it fails, and the
users already on it are left with no budget, which LiteLLM then does not enforce. The tiers
are the service's own (the catalogue), so `BudgetLinks` writes a missing row again and
carries on, and gives users with no budget their tier's back: at their next request (the
tier is in their id) and at every start. Each repair is one WARNING line and a count in
`mlpa_budget_rows_restored_total` / `mlpa_budget_links_restored_total`.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from ..catalog import BudgetTier
from ..observability.labels import AT_ADMISSION, AT_BUDGET_CHANGE, AT_REQUEST, AT_START
from ..observability.metrics import Metrics
from .base import BudgetMissing, EndUser, StoreUnavailable, UserStore

log = structlog.get_logger(__name__)

# AT_*: where a repair happened, the metrics' `at` label (observability/labels.py).



class BudgetRestoreFailed(StoreUnavailable):
    """A tier's missing budget row could not be written again (already logged, with the
    database's message)."""


class BudgetLinks:
    def __init__(self, store: UserStore, budgets: Mapping[str, BudgetTier], metrics: Metrics) -> None:
        self._store = store
        self._budgets = budgets
        self._metrics = metrics

    async def ensure_at_start(self) -> None:
        """Write every tier's row; relink the users whose budget is unset."""
        relinked = await self._store.ensure_budgets(self._budgets)
        for service_type, count in relinked.items():
            if count:
                self._links_restored(service_type, AT_START, count)

    async def create_user(self, user_id: str, service_type: str) -> EndUser | None:
        """Create the user with its tier's budget; when LiteLLM refused it because that
        budget's row is gone, write the row and create it once more. None: not created.
        Raises `BudgetRestoreFailed`."""
        tier = self._budgets[service_type]
        user = await self._store.create_user(user_id, tier.budget_id)
        if user is not None or await self._store.budget_exists(tier.budget_id):
            return user
        await self._restore(service_type, AT_ADMISSION)
        return await self._store.create_user(user_id, tier.budget_id)

    async def relink(self, user: EndUser, service_type: str) -> EndUser:
        """`user` (whose budget is unset) with its tier's budget again. A store failure
        leaves it as it is, logged: the request is served, the next one tries again."""
        tier = self._budgets[service_type]
        try:
            try:
                relinked = await self._store.relink_budget(user.user_id, tier.budget_id)
            except BudgetMissing:
                await self._restore(service_type, AT_REQUEST)
                relinked = await self._store.relink_budget(user.user_id, tier.budget_id)
        except BudgetRestoreFailed:
            return user
        except (StoreUnavailable, BudgetMissing) as exc:
            log.error("budget_link_restore_failed", service_type=service_type, budget_id=tier.budget_id, error=str(exc) or type(exc).__name__)
            return user
        if relinked is None:  # another request got there first
            return user
        self._links_restored(service_type, AT_REQUEST, 1)
        return relinked

    async def set_budget(self, user_id: str, service_type: str) -> EndUser | None:
        """The admin API's budget change, with a missing row written again first. None: no
        such user. Raises `StoreUnavailable`, its cause logged once."""
        tier = self._budgets[service_type]
        try:
            try:
                return await self._store.set_budget(user_id, tier.budget_id)
            except BudgetMissing:
                await self._restore(service_type, AT_BUDGET_CHANGE)
                return await self._store.set_budget(user_id, tier.budget_id)
        except BudgetRestoreFailed:
            raise
        except (StoreUnavailable, BudgetMissing) as exc:
            log.error("budget_change_failed", service_type=service_type, budget_id=tier.budget_id, error=str(exc) or type(exc).__name__)
            raise StoreUnavailable(str(exc)) from exc

    async def _restore(self, service_type: str, at: str) -> None:
        tier = self._budgets[service_type]
        try:
            await self._store.restore_budget(tier)
        except StoreUnavailable as exc:
            log.error("budget_row_restore_failed", service_type=service_type, budget_id=tier.budget_id, at=at, error=str(exc))
            raise BudgetRestoreFailed(str(exc)) from exc
        log.warning("budget_row_restored", service_type=service_type, budget_id=tier.budget_id, at=at)
        self._metrics.budget_rows_restored.labels(service_type, at).inc()

    def _links_restored(self, service_type: str, at: str, count: int) -> None:
        log.warning("budget_links_restored", service_type=service_type, users=count, at=at)
        self._metrics.budget_links_restored.labels(service_type, at).inc(count)
