"""Putting the service's state where a test needs it, through the public interfaces only.

A user that "already exists" is created as the service itself creates one (the store's
`create_user`, which asks LiteLLM's `/customer/new`), then blocked with `set_blocked` when
the test wants a blocked user. The open-stream count of one identity is read from
`StreamSlots` by taking and giving back the slots that are free.
"""

from __future__ import annotations

from datetime import datetime

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, ServiceType
from mlpa_aiohttp.store.base import UserStore
from mlpa_aiohttp.store.memory import MemoryUserStore
from mlpa_aiohttp.stream_slots import StreamSlots


async def seed_user(store: UserStore, user_id: str, budget_id: str | None = None, *, blocked: bool = False) -> None:
    """An end user as LiteLLM holds it; the budget defaults to the service type's tier."""
    if budget_id is None:
        budget_id = BUILTIN_CATALOG.budgets[ServiceType(user_id.rsplit(":", 1)[1])].budget_id
    created = await store.create_user(user_id, budget_id)
    assert created is not None, f"{user_id} could not be created"
    if blocked:
        assert await store.set_blocked(user_id, True) is not None


def slots_held(slots: StreamSlots, identity: str) -> int:
    """How many open-stream slots `identity` holds (the cap minus the ones it could take).

    Synchronous, like `try_take` / `give_back`: nothing runs between the probe's steps.
    """
    assert slots.enabled, "the per-user stream cap is off: nothing is held"
    free = 0
    while slots.try_take(identity):
        free += 1
    for _ in range(free):
        slots.give_back(identity)
    return slots.limit - free



def add_memory_row(store: MemoryUserStore, user_id: str, budget_id: str | None = None, *, blocked: bool = False) -> None:
    """A row of LiteLLM's end-user table that the service never creates itself (no budget,
    an id without a service type, LiteLLM unreachable), for tests that seed the PostgreSQL
    store with a plain INSERT into that table. The memory store has no public way to hold
    such a row, so this writes the one the store keeps for LiteLLM's table."""
    store._users[user_id] = {
        "user_id": user_id,
        "alias": None,
        "spend": 0.0,
        "budget_id": budget_id,
        "blocked": blocked,
    }


def set_memory_spend(store: MemoryUserStore, user_id: str, spend: float) -> None:
    """What LiteLLM's spend tracking would have written for `user_id` by now (the Postgres
    tests UPDATE LiteLLM's table the same way)."""
    store._users[user_id]["spend"] = spend


def set_memory_budget_reset(store: MemoryUserStore, budget_id: str, when: datetime) -> None:
    """What LiteLLM's budget reset job would have written for the tier `budget_id`."""
    store._budget_resets[budget_id] = when
