"""The signup cap on real Postgres: races, cancellation, lock timeouts, reconciliation."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import asyncpg
import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, ServiceType
from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.store.base import StoreUnavailable
from mlpa_aiohttp.store.pools import Pools, open_pools
from mlpa_aiohttp.store.postgres import PostgresUserStore
from .conftest import RecordingCreator, insert_user

pytestmark = pytest.mark.postgres

CAPPED = frozenset({ServiceType.AI, ServiceType.MEMORIES})
AI_BUDGET = BUILTIN_CATALOG.budgets[ServiceType.AI].budget_id


async def claims(pools: Pools) -> set[str]:
    return {r["base_identity"] for r in await pools.app.fetch("SELECT base_identity FROM mlpa_user_capacity_identities")}


async def current(pools: Pools) -> int:
    return int(await pools.app.fetchval("SELECT current_identities FROM mlpa_user_capacity WHERE id = 1"))


async def assert_nothing_held(pool: asyncpg.Pool, pools: Pools) -> None:
    """Every connection back in the pool, and no session of ours left inside a transaction."""
    deadline = time.monotonic() + 5
    while pool.get_idle_size() != pool.get_size():
        assert time.monotonic() < deadline, "a connection was not returned to the pool"
        await asyncio.sleep(0.02)
    in_transaction = await pools.litellm.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'mlpa:%'"
        " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
    )
    assert in_transaction == 0


@pytest.fixture
async def locked_capacity_row(pools: Pools, pg_store: PostgresUserStore) -> AsyncIterator[None]:
    """Another session holding the singleton row lock, as a slow admission would."""
    await pg_store.ensure_capacity_state(10, CAPPED)
    async with pools.app.acquire() as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM mlpa_user_capacity WHERE id = 1 FOR UPDATE")
            yield


async def test_fifty_concurrent_signups_against_a_cap_of_ten(pg_store: PostgresUserStore, pools: Pools) -> None:
    await pg_store.ensure_capacity_state(10, CAPPED)
    results = await asyncio.gather(*(pg_store.admit(f"user-{i}") for i in range(50)))
    assert sum(r.admitted for r in results) == 10
    assert sum(r.newly_claimed for r in results) == 10
    assert await current(pools) == 10
    assert len(await claims(pools)) == 10


async def test_concurrent_first_requests_of_one_identity_claim_one_slot(pg_store: PostgresUserStore, pools: Pools) -> None:
    await pg_store.ensure_capacity_state(10, CAPPED)
    results = await asyncio.gather(*(pg_store.admit("same") for _ in range(20)))
    assert all(r.admitted for r in results)
    assert sum(r.newly_claimed for r in results) == 1
    assert await current(pools) == 1


class BlockingCreator:
    """A LiteLLM that never answers `/customer/new` until told to."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.proceed = asyncio.Event()

    async def create_customer(self, user_id: str, budget_id: str) -> None:
        self.entered.set()
        await self.proceed.wait()


async def provision(store: PostgresUserStore, base: str, service_type: ServiceType) -> None:
    """The provisioning steps as the routes run them: a newly claimed slot is given back
    (shielded) when user creation does not complete, cancellation included."""
    admission = await store.admit(base)
    assert admission.admitted
    try:
        await store.create_user(f"{base}:{service_type.value}", AI_BUDGET)
    except BaseException:
        if admission.newly_claimed:
            await asyncio.shield(store.release(base, CAPPED))
        raise


async def test_request_cancelled_between_admission_and_creation_gives_the_slot_back(
    pools: Pools, pg_settings: PostgresSettings
) -> None:
    creator = BlockingCreator()
    store = PostgresUserStore(pools, creator, pg_settings)
    await store.ensure_capacity_state(10, CAPPED)
    task = asyncio.create_task(provision(store, "quitter", ServiceType.AI))
    await asyncio.wait_for(creator.entered.wait(), 5)
    assert await current(pools) == 1  # admitted, creation pending
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await current(pools) == 0
    assert await claims(pools) == set()
    await assert_nothing_held(pools.app, pools)
    await assert_nothing_held(pools.litellm, pools)


async def test_cancelled_while_waiting_for_the_lock_holds_nothing(pg_store: PostgresUserStore, pools: Pools) -> None:
    await pg_store.ensure_capacity_state(10, CAPPED)
    holder = pools.app.acquire()
    conn = await holder.__aenter__()
    transaction = conn.transaction()
    await transaction.start()
    await conn.execute("SELECT 1 FROM mlpa_user_capacity WHERE id = 1 FOR UPDATE")
    try:
        task = asyncio.create_task(pg_store.admit("waiting"))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await transaction.rollback()
        await holder.__aexit__(None, None, None)
    await assert_nothing_held(pools.app, pools)
    assert await current(pools) == 0
    assert (await pg_store.admit("waiting")).newly_claimed  # the lock is free again


async def test_cancelled_release_and_create_leave_nothing_held(pg_store: PostgresUserStore, pools: Pools) -> None:
    await pg_store.ensure_capacity_state(10, CAPPED)
    for step in (pg_store.admit("a"), pg_store.release("a", CAPPED), pg_store.get_user("a:ai"), pg_store.list_users(5, 0)):
        task = asyncio.ensure_future(step)
        await asyncio.sleep(0)  # let it start its first round trip
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await assert_nothing_held(pools.app, pools)
    await assert_nothing_held(pools.litellm, pools)
    assert await current(pools) == len(await claims(pools))


async def test_lock_timeout_fails_fast(pools: Pools, pg_settings: PostgresSettings, locked_capacity_row: None) -> None:
    store = PostgresUserStore(pools, RecordingCreator(), pg_settings, admission_lock_timeout_ms=200)
    # LockNotAvailable is the lock timeout's error (a statement timeout would be another):
    # admission gave up waiting for the lock instead of queueing behind it.
    with pytest.raises(StoreUnavailable, match="LockNotAvailable"):
        await store.admit("impatient")


async def test_release_keeps_the_slot_while_a_capped_user_exists(pg_store: PostgresUserStore, pools: Pools) -> None:
    await pg_store.ensure_capacity_state(10, CAPPED)
    await pg_store.admit("u")
    await pg_store.create_user("u:memories", AI_BUDGET)
    await pg_store.release("u", CAPPED)
    assert await claims(pools) == {"u"}
    assert await current(pools) == 1


async def test_reconciliation_rebuilds_claims_from_litellm(pg_store: PostgresUserStore, pools: Pools) -> None:
    await pg_store.ensure_capacity_state(100, CAPPED)
    for base in ("stale-1", "stale-2"):
        await pg_store.admit(base)
    await pools.app.execute("UPDATE mlpa_user_capacity SET current_identities = 42")  # drifted counter
    for user_id in ("a:ai", "a:memories", "b:memories", "c:s2s", "d:ai"):
        await insert_user(pools.litellm, user_id)
    await pg_store.ensure_capacity_state(100, CAPPED)
    assert await claims(pools) == {"a", "b", "d"}
    assert await current(pools) == 3


async def test_two_workers_starting_together_leave_a_correct_count(
    pg_store: PostgresUserStore, pools: Pools, pg_settings: PostgresSettings
) -> None:
    await pg_store.ensure_capacity_state(1000, CAPPED)
    await pg_store.admit("stale")
    for i in range(200):
        await insert_user(pools.litellm, f"user-{i}:{'ai' if i % 2 else 'memories'}")
        if i % 3 == 0:
            await insert_user(pools.litellm, f"user-{i}:ai-dev")
    async with open_pools(pg_settings) as other_pools:
        other = PostgresUserStore(other_pools, RecordingCreator(), pg_settings)
        await asyncio.gather(
            pg_store.ensure_capacity_state(1000, CAPPED),
            other.ensure_capacity_state(1000, CAPPED),
            pg_store.ensure_capacity_state(1000, CAPPED),
        )
    assert await claims(pools) == {f"user-{i}" for i in range(200)}
    assert await current(pools) == 200


async def test_budgets_are_upserted_for_all_tiers(pg_store: PostgresUserStore, pools: Pools) -> None:
    await pg_store.ensure_budgets(BUILTIN_CATALOG.budgets)
    rows = {r["budget_id"]: r for r in await pools.litellm.fetch('SELECT * FROM "LiteLLM_BudgetTable"')}
    assert set(rows) == {tier.budget_id for tier in BUILTIN_CATALOG.budgets.values()}
    agent = rows["end-user-budget-agent"]
    assert (agent["max_budget"], agent["rpm_limit"], agent["tpm_limit"], agent["budget_duration"]) == (0.1, 10, 2000, "7d")
    assert agent["created_by"] == agent["updated_by"] == "default_user_id"
    changed = dict(BUILTIN_CATALOG.budgets)
    tier = BUILTIN_CATALOG.budgets[ServiceType.AGENT]
    changed[ServiceType.AGENT] = type(tier)(tier.budget_id, 5.0, 99, 999, "30d")
    await pg_store.ensure_budgets(changed)
    agent = await pools.litellm.fetchrow(
        'SELECT max_budget, rpm_limit, tpm_limit, budget_duration FROM "LiteLLM_BudgetTable" WHERE budget_id = $1',
        tier.budget_id,
    )
    assert tuple(agent) == (5.0, 99, 999, "30d")
