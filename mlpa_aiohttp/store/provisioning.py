"""Provision the caller's LiteLLM end user: get or create it, with the signup cap, and
refuse a blocked one (compatibility.md §3.1, §3.2).

Creation (claim a slot, create the user, give the slot back on failure) runs shielded
from the request: a client that leaves mid-way must never leak a capacity slot. A user
found with no budget (its row was deleted) gets its tier's back (budget_links.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import structlog

from ..errors import ApiError, BadRequest, ProvisioningFailed, SignupCapExceeded, UserBlocked
from ..settings import SignupCapSettings
from ..wire import is_base_identity
from .base import CapacityStateMissing, EndUser, UserStore
from .budget_links import BudgetLinks, BudgetRestoreFailed

log = structlog.get_logger(__name__)

INVALID_USER_ID = {"error": "Invalid user_id format"}
CREATION_FAILED = {"error": "User creation failed after admission"}
FETCH_FAILED = {"error": "Error fetching user info"}
CAPACITY_MISSING = "Capacity state not initialized"


class Provisioner:
    def __init__(
        self, store: UserStore, budget_links: BudgetLinks, service_types: Collection[str], signup_cap: SignupCapSettings
    ) -> None:
        self._store = store
        self._budget_links = budget_links
        self._service_types = service_types
        self._cap = signup_cap

    async def provision(self, user_id: str) -> EndUser:
        """The caller's end user, created on first use. Raises `UserBlocked` for a blocked
        one, `SignupCapExceeded` when a new identity finds the cap full, and
        `ProvisioningFailed` when the store fails."""
        user = await self._get_or_create(user_id)
        if user.blocked:
            raise UserBlocked()
        return user

    async def _get_or_create(self, user_id: str) -> EndUser:
        base_identity, _, suffix = user_id.partition(":")
        service_type = suffix
        if not is_base_identity(base_identity) or service_type not in self._service_types:
            raise BadRequest(INVALID_USER_ID)
        try:
            user = await self._store.get_user(user_id)
            if user is not None:
                return user if user.budget_id is not None else await self._budget_links.relink(user, service_type)
            creation = asyncio.ensure_future(self._create(base_identity, user_id, service_type))
            try:
                return await asyncio.shield(creation)
            except asyncio.CancelledError:
                creation.add_done_callback(_log_orphaned_failure)
                raise
        except ApiError:
            raise
        except BudgetRestoreFailed:  # logged where it failed, with the database's message
            raise ProvisioningFailed(CREATION_FAILED) from None
        except Exception as exc:
            log.error("provisioning_failed", error_type=type(exc).__name__, exc_info=exc)
            raise ProvisioningFailed(FETCH_FAILED) from None

    async def _create(self, base_identity: str, user_id: str, service_type: str) -> EndUser:
        newly_claimed = False
        if self._cap.enforce and service_type in self._cap.capped_service_types:
            try:
                admission = await self._store.admit(base_identity)
            except CapacityStateMissing:
                raise ProvisioningFailed(CAPACITY_MISSING) from None
            if not admission.admitted:
                raise SignupCapExceeded()
            newly_claimed = admission.newly_claimed
        try:
            user = await self._budget_links.create_user(user_id, service_type)
        except BaseException:
            if newly_claimed:
                await self._release(base_identity)
            raise
        if user is None:
            if newly_claimed:
                await self._release(base_identity)
            log.error("user_missing_after_creation")
            raise ProvisioningFailed(CREATION_FAILED)
        return user

    async def _release(self, base_identity: str) -> None:
        try:
            await self._store.release(base_identity, self._cap.capped_service_types)
        except Exception as exc:
            log.error("capacity_release_failed", error_type=type(exc).__name__, exc_info=exc)


def _log_orphaned_failure(task: asyncio.Future[EndUser]) -> None:
    """A shielded creation whose requester left: retrieve its outcome so a failure is
    logged once instead of as 'exception never retrieved'."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, ApiError):
        log.info("provisioning_finished_after_client_left", error_type=type(exc).__name__)
