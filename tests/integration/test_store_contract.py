"""The `UserStore` contract, run against the memory store and the Postgres store alike."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, ServiceType
from mlpa_aiohttp.store.base import Admission, BudgetUsage, CapacityStateMissing

from .conftest import StoreUnderTest, assert_json_ready

pytestmark = pytest.mark.postgres

CAPPED = frozenset({ServiceType.AI, ServiceType.MEMORIES})
AI_BUDGET = BUILTIN_CATALOG.budgets[ServiceType.AI].budget_id


async def test_get_user_missing_then_present(any_store: StoreUnderTest) -> None:
    store = any_store.store
    assert await store.get_user("u1:ai") is None
    await any_store.add_user("u1:ai", AI_BUDGET, blocked=True)
    user = await store.get_user("u1:ai")
    assert user is not None
    assert (user.user_id, user.budget_id, user.blocked) == ("u1:ai", AI_BUDGET, True)
    assert {"user_id": "u1:ai", "budget_id": AI_BUDGET, "blocked": True, "alias": None}.items() <= user.record.items()
    assert user.record["spend"] == 0
    assert_json_ready(user.record)


@pytest.fixture(autouse=True)
async def started(any_store: StoreUnderTest) -> None:
    """Each store as the service has it after its start: every tier's budget row written."""
    await any_store.store.ensure_budgets(BUILTIN_CATALOG.budgets)


async def test_create_user_goes_through_litellm_and_is_idempotent(any_store: StoreUnderTest) -> None:
    store = any_store.store
    created = await store.create_user("u2:ai", AI_BUDGET)
    assert created is not None and created.budget_id == AI_BUDGET and not created.blocked
    again = await store.create_user("u2:ai", "some-other-budget")
    assert again is not None and again.budget_id == AI_BUDGET  # the first row wins
    assert any_store.calls == [("u2:ai", AI_BUDGET), ("u2:ai", "some-other-budget")]
    assert await store.get_user("u2:ai") == created


async def test_admit_without_capacity_row_is_an_error(any_store: StoreUnderTest) -> None:
    assert await any_store.store.capacity_state() is None
    with pytest.raises(CapacityStateMissing):
        await any_store.store.admit("someone")


async def test_admission_fills_up_and_rejects(any_store: StoreUnderTest) -> None:
    store = any_store.store
    await store.ensure_capacity_state(3, CAPPED)
    for base in ("a", "b", "c"):
        assert await store.admit(base) == Admission(admitted=True, newly_claimed=True)
    assert await store.admit("d") == Admission(admitted=False, newly_claimed=False)
    assert await store.admit("a") == Admission(admitted=True, newly_claimed=False)
    state = await store.capacity_state()
    assert state is not None
    assert (state.max_identities, state.current_identities) == (3, 3)
    assert state.updated_at is not None


async def test_same_identity_on_two_capped_types_uses_one_slot(any_store: StoreUnderTest) -> None:
    store = any_store.store
    await store.ensure_capacity_state(10, CAPPED)
    assert (await store.admit("x")).newly_claimed
    await store.create_user("x:ai", AI_BUDGET)
    assert await store.admit("x") == Admission(admitted=True, newly_claimed=False)
    await store.create_user("x:memories", BUILTIN_CATALOG.budgets[ServiceType.MEMORIES].budget_id)
    state = await store.capacity_state()
    assert state is not None and state.current_identities == 1


async def test_release_frees_only_identities_without_capped_users(any_store: StoreUnderTest) -> None:
    store = any_store.store
    await store.ensure_capacity_state(10, CAPPED)
    for base in ("kept", "freed", "uncapped-only"):
        assert (await store.admit(base)).newly_claimed
    await any_store.add_user("kept:memories")
    await any_store.add_user("uncapped-only:s2s")
    for base in ("kept", "freed", "uncapped-only", "never-claimed"):
        await store.release(base, CAPPED)
    state = await store.capacity_state()
    assert state is not None and state.current_identities == 1
    # The freed identity can be admitted again, as a new claim.
    assert await store.admit("freed") == Admission(admitted=True, newly_claimed=True)
    assert await store.admit("kept") == Admission(admitted=True, newly_claimed=False)


async def test_release_without_capacity_row_is_a_no_op(any_store: StoreUnderTest) -> None:
    await any_store.store.release("nobody", CAPPED)
    assert await any_store.store.capacity_state() is None


async def test_ensure_capacity_state_rebuilds_from_users(any_store: StoreUnderTest) -> None:
    store = any_store.store
    for user_id in ("a:ai", "a:memories", "b:memories", "c:s2s", "no-colon", "d:ai:extra", "e:search"):
        await any_store.add_user(user_id)
    await store.ensure_capacity_state(5, CAPPED)
    state = await store.capacity_state()
    assert state is not None and (state.max_identities, state.current_identities) == (5, 2)
    assert await store.admit("a") == Admission(admitted=True, newly_claimed=False)
    assert await store.admit("c") == Admission(admitted=True, newly_claimed=True)
    # Lowering the cap below the count evicts nobody; it only stops new admissions.
    await store.ensure_capacity_state(1, CAPPED)
    state = await store.capacity_state()
    assert state is not None and (state.max_identities, state.current_identities) == (1, 2)
    assert await store.admit("new") == Admission(admitted=False, newly_claimed=False)
    assert await store.admit("b") == Admission(admitted=True, newly_claimed=False)


async def test_list_users_orders_and_pages(any_store: StoreUnderTest) -> None:
    for user_id in ("c:ai", "a:ai", "b:s2s", "d:memories"):
        await any_store.add_user(user_id, AI_BUDGET)
    page, total = await any_store.store.list_users(2, 1)
    assert total == 4
    assert [u["user_id"] for u in page] == ["b:s2s", "c:ai"]
    assert_json_ready(page)
    empty, total = await any_store.store.list_users(50, 10)
    assert (empty, total) == ([], 4)


async def test_counts_by_service_type(any_store: StoreUnderTest) -> None:
    for user_id in ("a:ai", "b:ai", "a:memories", "c:s2s", "no-colon", "d:ai:extra"):
        await any_store.add_user(user_id)
    assert await any_store.store.counts_by_service_type() == {"ai": 3, "memories": 1, "s2s": 1}


async def test_counts_when_empty(any_store: StoreUnderTest) -> None:
    assert await any_store.store.counts_by_service_type() == {}


async def test_set_budget_and_blocked(any_store: StoreUnderTest) -> None:
    store = any_store.store
    await any_store.add_user("u:ai", AI_BUDGET)
    moved = await store.set_budget("u:ai", "end-user-budget-ai-dev")
    assert moved is not None and moved.budget_id == "end-user-budget-ai-dev"
    blocked = await store.set_blocked("u:ai", True)
    assert blocked is not None and blocked.blocked and blocked.record["blocked"] is True
    assert blocked.record["budget_id"] == "end-user-budget-ai-dev"
    unblocked = await store.set_blocked("u:ai", False)
    assert unblocked is not None and not unblocked.blocked
    assert_json_ready(unblocked.record)
    assert await store.set_budget("missing:ai", AI_BUDGET) is None
    assert await store.set_blocked("missing:ai", True) is None


async def test_ensure_budgets_and_ping(any_store: StoreUnderTest) -> None:
    await any_store.store.ensure_budgets(BUILTIN_CATALOG.budgets)
    await any_store.store.ensure_budgets(BUILTIN_CATALOG.budgets)  # idempotent
    assert await any_store.store.ping() == {"postgres": True, "app_attest": True}


# -- GET /v1/usage: spend joined with the budget's limits ------------------------------------


async def test_usage_of_a_missing_user_is_none(any_store: StoreUnderTest) -> None:
    await any_store.store.ensure_budgets(BUILTIN_CATALOG.budgets)
    assert await any_store.store.get_usage("nobody:ai") is None


async def test_usage_joins_spend_with_the_users_budget(any_store: StoreUnderTest) -> None:
    store = any_store.store
    await store.ensure_budgets(BUILTIN_CATALOG.budgets)
    await any_store.add_user("spender:ai", AI_BUDGET)
    await any_store.add_user("spender:memories", BUILTIN_CATALOG.budgets[ServiceType.MEMORIES].budget_id, blocked=True)
    await any_store.set_spend("spender:ai", 0.0425)
    reset = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
    await any_store.set_budget_reset_at(AI_BUDGET, reset)

    ai = await store.get_usage("spender:ai")
    tier = BUILTIN_CATALOG.budgets[ServiceType.AI]
    assert ai == BudgetUsage(
        spend=0.0425,
        blocked=False,
        budget_id=AI_BUDGET,
        max_budget=tier.max_budget,
        budget_duration=tier.budget_duration,
        budget_reset_at=reset,
        tpm_limit=tier.tpm_limit,
        rpm_limit=tier.rpm_limit,
    )
    # Each user id is its own row: the other service type keeps its own spend and tier.
    memories = await store.get_usage("spender:memories")
    assert memories is not None and memories.spend == 0 and memories.blocked
    assert (memories.rpm_limit, memories.budget_reset_at) == (BUILTIN_CATALOG.budgets[ServiceType.MEMORIES].rpm_limit, None)


async def test_usage_without_a_budget_has_no_limits(any_store: StoreUnderTest) -> None:
    store = any_store.store
    await store.ensure_budgets(BUILTIN_CATALOG.budgets)
    await any_store.add_user("no-budget:ai")
    await any_store.add_user("unknown-budget:ai", "no-such-budget")
    for user_id in ("no-budget:ai", "unknown-budget:ai"):
        usage = await store.get_usage(user_id)
        assert usage is not None
        assert (usage.spend, usage.max_budget, usage.budget_duration, usage.budget_reset_at) == (0, None, None, None)
        assert (usage.tpm_limit, usage.rpm_limit) == (None, None)
