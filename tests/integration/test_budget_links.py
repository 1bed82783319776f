"""What LiteLLM's foreign key from end users to budgets does to the service, and the repairs:
a tier's budget row deleted (as LiteLLM's own budget API deletes one) or never written, at
admission, at a budget change, for the users it left with no budget, at the next start. Over
real HTTP, on LiteLLM's real schema, with the fake LiteLLM writing end users into it."""

from __future__ import annotations

import datetime

import asyncpg
import pytest

from mlpa_aiohttp.store.pools import Pools, open_pools
from mlpa_aiohttp.store.postgres import PostgresUserStore
from mlpa_aiohttp.catalog import BUILTIN_CATALOG, ServiceType
from mlpa_aiohttp.settings import PostgresSettings
from tests.support.metrics import sample

from ..conftest import TEST_SECRETS, Service, chat_body, events
from .conftest import PgServiceFactory, RecordingCreator, insert_user

pytestmark = pytest.mark.postgres

AI_BUDGET = BUILTIN_CATALOG.budgets[ServiceType.AI].budget_id
MEMORIES_BUDGET = BUILTIN_CATALOG.budgets[ServiceType.MEMORIES].budget_id
MASTER = {"master_key": f"Bearer {TEST_SECRETS['MASTER_KEY']}"}
FOREIGN_KEY_MESSAGE = "Foreign key constraint failed on the field: `LiteLLM_EndUserTable_budget_id_fkey (index)`"

# Stands for any reason the budget row cannot be written (a role without the grant, say).
_REFUSE_BUDGET_WRITES = """
CREATE FUNCTION refuse_budget_writes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'budget writes refused for this test'; END $$;
CREATE TRIGGER refuse_budget_writes BEFORE INSERT OR UPDATE ON "LiteLLM_BudgetTable"
    FOR EACH ROW EXECUTE FUNCTION refuse_budget_writes();
"""
_ALLOW_BUDGET_WRITES = """
DROP TRIGGER IF EXISTS refuse_budget_writes ON "LiteLLM_BudgetTable";
DROP FUNCTION IF EXISTS refuse_budget_writes();
"""


async def delete_budget_row(pools: Pools, budget_id: str) -> None:
    """What LiteLLM's `/budget/delete` does: the row goes, its users' budget_id becomes NULL."""
    await pools.litellm.execute('DELETE FROM "LiteLLM_BudgetTable" WHERE budget_id = $1', budget_id)


async def budget_of(pools: Pools, user_id: str) -> str | None:
    return await pools.litellm.fetchval('SELECT budget_id FROM "LiteLLM_EndUserTable" WHERE user_id = $1', user_id)


async def budget_row_exists(pools: Pools, budget_id: str) -> bool:
    return await pools.litellm.fetchval(
        'SELECT EXISTS (SELECT 1 FROM "LiteLLM_BudgetTable" WHERE budget_id = $1)', budget_id
    )


async def chat_as(service: Service, uid: str) -> int:
    token = service.fxa.issue_jwt(uid)
    response = await service.chat(chat_body(stream=True), headers=service.headers(authorization=f"Bearer {token}"))
    await response.read()
    return response.status


@pytest.fixture
async def pg_service(make_pg_service: PgServiceFactory) -> Service:
    return await make_pg_service(token_uid="pg-uid", MLPA_ENFORCE_SIGNIN_CAP="true", MLPA_MAX_SIGNED_IN_USERS="5")


# -- admission ---------------------------------------------------------------------------


async def test_a_new_user_of_a_tier_whose_row_is_gone_is_created_after_the_row_is_restored(
    pg_service: Service, pools: Pools, caplog: pytest.LogCaptureFixture
) -> None:
    await delete_budget_row(pools, AI_BUDGET)
    assert await chat_as(pg_service, "newcomer") == 200
    assert await budget_of(pools, "newcomer:ai") == AI_BUDGET
    tier = BUILTIN_CATALOG.budgets[ServiceType.AI]
    row = await pools.litellm.fetchrow('SELECT max_budget, rpm_limit FROM "LiteLLM_BudgetTable" WHERE budget_id = $1', AI_BUDGET)
    assert (row["max_budget"], row["rpm_limit"]) == (tier.max_budget, tier.rpm_limit)  # from the catalogue
    assert sample(pg_service, "mlpa_budget_rows_restored_total", {"service_type": "ai", "at": "admission"}) == 1
    # Why the first creation failed, in LiteLLM's words; then the repair.
    [refused] = events(caplog, "litellm_customer_new_status")
    assert (refused["level"], refused["status"], refused["upstream_detail"]) == ("WARNING", 500, FOREIGN_KEY_MESSAGE)
    [restored] = events(caplog, "budget_row_restored")
    assert restored["level"] == "WARNING" and (restored["budget_id"], restored["at"]) == (AI_BUDGET, "admission")
    # The next new user of that tier needs no repair.
    assert await chat_as(pg_service, "second") == 200
    assert sample(pg_service, "mlpa_budget_rows_restored_total", {"service_type": "ai", "at": "admission"}) == 1


async def test_when_the_row_cannot_be_restored_admission_answers_the_reference_error_and_logs_the_cause_once(
    pg_service: Service, pools: Pools, caplog: pytest.LogCaptureFixture
) -> None:
    await delete_budget_row(pools, AI_BUDGET)
    await pools.litellm.execute(_REFUSE_BUDGET_WRITES)
    try:
        token = pg_service.fxa.issue_jwt("newcomer")
        response = await pg_service.chat(headers=pg_service.headers(authorization=f"Bearer {token}"))
        assert (response.status, await response.json()) == (
            500,
            {"detail": {"error": "User creation failed after admission"}},
        )
    finally:
        await pools.litellm.execute(_ALLOW_BUDGET_WRITES)
    [failure] = [e for e in events(caplog) if e["level"] == "ERROR"]
    assert failure["event"] == "budget_row_restore_failed" and failure["at"] == "admission"
    assert "budget writes refused for this test" in failure["error"]
    assert not [e for e in events(caplog) if e.get("exc_info")]  # one line, no traceback
    # The capacity slot claimed for the new identity was given back.
    assert await pools.app.fetchval("SELECT current_identities FROM mlpa_user_capacity WHERE id = 1") == 0
    assert await budget_of(pools, "newcomer:ai") is None
    # With the cause gone, the same user is created (and the row restored) on its next try.
    assert await chat_as(pg_service, "newcomer") == 200
    assert await budget_of(pools, "newcomer:ai") == AI_BUDGET


# -- budget changes (admin API) -----------------------------------------------------------


async def test_a_budget_change_to_a_tier_whose_row_is_gone_restores_the_row(
    pg_service: Service, pools: Pools, caplog: pytest.LogCaptureFixture
) -> None:
    await insert_user(pools.litellm, "someone:ai", AI_BUDGET)
    await delete_budget_row(pools, MEMORIES_BUDGET)
    response = await pg_service.client.post("/user/someone:ai/budget", json={"service_type": "memories"}, headers=MASTER)
    assert (response.status, await response.json()) == (
        200,
        {"user_id": "someone:ai", "budget_id": MEMORIES_BUDGET, "service_type": "memories"},
    )
    assert await budget_of(pools, "someone:ai") == MEMORIES_BUDGET
    assert await budget_row_exists(pools, MEMORIES_BUDGET)
    labels = {"service_type": "memories", "at": "budget_change"}
    assert sample(pg_service, "mlpa_budget_rows_restored_total", labels) == 1
    assert [e["at"] for e in events(caplog, "budget_row_restored")] == ["budget_change"]


async def test_a_budget_change_that_cannot_restore_the_row_is_a_500_with_its_cause_in_one_line(
    pg_service: Service, pools: Pools, caplog: pytest.LogCaptureFixture
) -> None:
    await insert_user(pools.litellm, "someone:ai", AI_BUDGET)
    await delete_budget_row(pools, MEMORIES_BUDGET)
    await pools.litellm.execute(_REFUSE_BUDGET_WRITES)
    try:
        response = await pg_service.client.post(
            "/user/someone:ai/budget", json={"service_type": "memories"}, headers=MASTER
        )
    finally:
        await pools.litellm.execute(_ALLOW_BUDGET_WRITES)
    assert (response.status, await response.json()) == (500, {"detail": {"error": "Error updating user budget"}})
    [failure] = [e for e in events(caplog) if e["level"] == "ERROR"]
    assert failure["event"] == "budget_row_restore_failed" and failure["at"] == "budget_change"
    assert "budget writes refused for this test" in failure["error"]
    assert await budget_of(pools, "someone:ai") == AI_BUDGET  # unchanged


async def test_a_budget_change_that_fails_for_another_reason_logs_the_database_message(
    pg_service: Service, pools: Pools, caplog: pytest.LogCaptureFixture
) -> None:
    await insert_user(pools.litellm, "someone:ai", AI_BUDGET)
    await pools.litellm.execute(
        """
        CREATE FUNCTION refuse_user_updates() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'end-user updates refused for this test'; END $$;
        CREATE TRIGGER refuse_user_updates BEFORE UPDATE ON "LiteLLM_EndUserTable"
            FOR EACH ROW EXECUTE FUNCTION refuse_user_updates();
        """
    )
    try:
        response = await pg_service.client.post(
            "/user/someone:ai/budget", json={"service_type": "memories"}, headers=MASTER
        )
    finally:
        await pools.litellm.execute(
            'DROP TRIGGER refuse_user_updates ON "LiteLLM_EndUserTable"; DROP FUNCTION refuse_user_updates();'
        )
    assert (response.status, await response.json()) == (500, {"detail": {"error": "Error updating user budget"}})
    [failure] = [e for e in events(caplog) if e["level"] == "ERROR"]
    assert failure["event"] == "budget_change_failed" and "end-user updates refused for this test" in failure["error"]


# -- users left with no budget -------------------------------------------------------------


async def test_a_user_left_without_a_budget_gets_its_tiers_back_at_its_next_request(
    pg_service: Service, pools: Pools, caplog: pytest.LogCaptureFixture
) -> None:
    assert await chat_as(pg_service, "regular") == 200
    await delete_budget_row(pools, AI_BUDGET)
    assert await budget_of(pools, "regular:ai") is None  # LiteLLM would no longer enforce a budget
    assert await chat_as(pg_service, "regular") == 200
    assert await budget_of(pools, "regular:ai") == AI_BUDGET
    at_request = {"service_type": "ai", "at": "request"}
    assert sample(pg_service, "mlpa_budget_rows_restored_total", at_request) == 1
    assert sample(pg_service, "mlpa_budget_links_restored_total", at_request) == 1
    [relinked] = events(caplog, "budget_links_restored")
    assert (relinked["level"], relinked["users"], relinked["at"]) == ("WARNING", 1, "request")
    assert await chat_as(pg_service, "regular") == 200  # nothing more to repair
    assert sample(pg_service, "mlpa_budget_links_restored_total", at_request) == 1


async def test_the_start_relinks_every_user_left_without_a_budget_and_nobody_else(
    make_pg_service: PgServiceFactory, pools: Pools
) -> None:
    await make_pg_service()  # the tiers' rows written, as at any start
    for user_id in ("a:ai", "b:ai", "c:memories"):
        await insert_user(pools.litellm, user_id, BUILTIN_CATALOG.budgets[ServiceType(user_id.split(":")[1])].budget_id)
    await insert_user(pools.litellm, "chosen:ai", MEMORIES_BUDGET)  # an operator's choice stays
    await delete_budget_row(pools, AI_BUDGET)
    await insert_user(pools.litellm, "no-tier:unknown-type")  # not one of the service's types
    await insert_user(pools.litellm, "no-colon")
    restarted = await make_pg_service()
    assert {uid: await budget_of(pools, uid) for uid in ("a:ai", "b:ai", "c:memories", "chosen:ai", "no-tier:unknown-type", "no-colon")} == {
        "a:ai": AI_BUDGET,
        "b:ai": AI_BUDGET,
        "c:memories": MEMORIES_BUDGET,
        "chosen:ai": MEMORIES_BUDGET,
        "no-tier:unknown-type": None,
        "no-colon": None,
    }
    assert sample(restarted, "mlpa_budget_links_restored_total", {"service_type": "ai", "at": "start"}) == 2
    assert sample(restarted, "mlpa_budget_links_restored_total", {"service_type": "memories", "at": "start"}) == 0


# -- timestamps ------------------------------------------------------------------------------


async def test_budget_rows_are_written_in_utc_whatever_the_sessions_time_zone(pg_settings: PostgresSettings, pools: Pools) -> None:
    await delete_budget_row(pools, AI_BUDGET)
    database = pg_settings.litellm_db_name
    # The session default of every new connection to LiteLLM's database, the pool's included.
    await pools.litellm.execute(f"ALTER DATABASE \"{database}\" SET TIME ZONE 'America/New_York'")
    try:
        async with open_pools(pg_settings) as new_york:
            assert await new_york.litellm.fetchval("SHOW TIME ZONE") == "America/New_York"
            before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            store = PostgresUserStore(new_york, RecordingCreator(), pg_settings)
            await store.ensure_budgets({ServiceType.AI: BUILTIN_CATALOG.budgets[ServiceType.AI]})  # inserts the row
            await store.restore_budget(BUILTIN_CATALOG.budgets[ServiceType.AI])  # updates it
            after = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    finally:
        await pools.litellm.execute(f'ALTER DATABASE "{database}" RESET TIME ZONE')
    row = await pools.litellm.fetchrow(
        'SELECT created_at, updated_at, created_by, updated_by FROM "LiteLLM_BudgetTable" WHERE budget_id = $1', AI_BUDGET
    )
    slack = datetime.timedelta(seconds=1)  # timestamp(3): milliseconds, rounded
    assert before - slack <= row["created_at"] <= row["updated_at"] <= after + slack
    assert (row["created_by"], row["updated_by"]) == ("default_user_id", "default_user_id")


# -- LiteLLM's view of a user through the admin API -----------------------------------------


async def test_user_info_is_litellms_record_and_an_unknown_user_is_its_404(pg_service: Service, pools: Pools) -> None:
    assert await chat_as(pg_service, "known") == 200
    found = await pg_service.client.get("/user/known:ai", headers=MASTER)
    assert found.status == 200
    record = await found.json()
    assert (record["user_id"], record["budget_id"], record["models"], record["object_permission_id"]) == (
        "known:ai", AI_BUDGET, [], None,
    )  # fmt: skip
    assert record["object_permission"] is None and record["litellm_budget_table"]["budget_id"] == AI_BUDGET
    unknown = await pg_service.client.get("/user/nobody:ai", headers=MASTER)
    assert (unknown.status, await unknown.json()) == (404, {"detail": {"error": "Error fetching user info"}})


async def test_the_admin_list_carries_litellms_real_columns(pg_service: Service, pools: Pools) -> None:
    assert await chat_as(pg_service, "listed") == 200
    response = await pg_service.client.get("/user", headers=MASTER)
    assert response.status == 200
    [user] = (await response.json())["users"]
    assert user["models"] == [] and user["object_permission_id"] is None and user["budget_id"] == AI_BUDGET
