"""The whole service with `MLPA_STORE=postgres`: real PostgreSQL, fake LiteLLM writing its
end users into the same database, FxA fake; outages answered with the reference bodies."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from mlpa_aiohttp.store.pools import Pools
from tests.support.postgres import ThrowawayPostgres

from ..conftest import Service, chat_body, events
from .conftest import PgServiceFactory

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_service(make_pg_service: PgServiceFactory) -> Service:
    return await make_pg_service(token_uid="pg-uid", MLPA_ENFORCE_SIGNIN_CAP="true", MLPA_MAX_SIGNED_IN_USERS="2")


async def test_streaming_completion_creates_the_user_in_litellms_table(pg_service: Service, pools: Pools) -> None:
    response = await pg_service.chat(chat_body(stream=True))
    assert response.status == 200
    assert (await response.read()).endswith(b"data: [DONE]\n\n")
    row = await pools.litellm.fetchrow('SELECT budget_id, blocked FROM "LiteLLM_EndUserTable" WHERE user_id = $1', "pg-uid:ai")
    assert row is not None and row["budget_id"] == "end-user-budget-ai" and row["blocked"] is False
    capacity = await pools.app.fetchval("SELECT current_identities FROM mlpa_user_capacity WHERE id = 1")
    assert capacity == 1
    # One row per service type: MLPA 1.0.39 has fifteen (sw-answer's and liner-answer's too).
    budgets = await pools.litellm.fetch('SELECT budget_id, max_budget FROM "LiteLLM_BudgetTable"')
    assert len(budgets) == 15
    assert dict((row["budget_id"], row["max_budget"]) for row in budgets)["end-user-budget-liner-answer"] == 0.06


async def test_blocked_in_the_database_is_403(pg_service: Service, pools: Pools) -> None:
    await pools.litellm.execute(
        'INSERT INTO "LiteLLM_EndUserTable" (user_id, budget_id, blocked) VALUES ($1, $2, true)',
        "pg-uid:ai",
        "end-user-budget-ai",
    )
    response = await pg_service.chat()
    assert (response.status, await response.json()) == (403, {"detail": {"error": "User is blocked."}})


async def test_signup_cap_through_the_service(pg_service: Service) -> None:
    for uid in ("a", "b"):
        token = pg_service.fxa.issue_jwt(uid)
        assert (await pg_service.chat(headers=pg_service.headers(authorization=f"Bearer {token}"))).status == 200
    third = pg_service.fxa.issue_jwt("c")
    refused = await pg_service.chat(headers=pg_service.headers(authorization=f"Bearer {third}"))
    assert (refused.status, await refused.json()) == (403, {"detail": {"error": 4}})


async def test_database_down_mid_traffic_then_recovers(pg_service: Service, pg_server: ThrowawayPostgres) -> None:
    assert (await pg_service.chat()).status == 200
    newcomer = pg_service.fxa.issue_jwt("newcomer")
    pg_server.stop()
    try:
        response = await pg_service.chat(headers=pg_service.headers(authorization=f"Bearer {newcomer}"))
        assert response.status == 500
        assert await response.json() == {"detail": {"error": "Error fetching user info"}}
        usage = await pg_service.client.get("/v1/usage", headers=pg_service.headers())
        assert (usage.status, await usage.json()) == (500, {"detail": {"error": "Error fetching usage"}})
        # The pod stays in the Service (compatibility.md D64): clients keep getting the bodies
        # above, not a load balancer's page; the body and mlpa_dependency_up say what is down.
        readiness = await pg_service.client.get("/health/readiness")
        assert readiness.status == 200
        body = await readiness.json()
        assert body["status"] == "degraded"
        assert body["pg_server_dbs"] == {"postgres": "offline", "app_attest": "offline"}
    finally:
        pg_server.start()
    response = await pg_service.chat(headers=pg_service.headers(authorization=f"Bearer {newcomer}"))
    assert response.status == 200


async def test_usage_reads_litellms_end_user_and_budget_tables(pg_service: Service, pools: Pools) -> None:
    for uid in ("pg-uid", "other-uid"):
        token = pg_service.fxa.issue_jwt(uid)
        assert (await pg_service.chat(headers=pg_service.headers(authorization=f"Bearer {token}"))).status == 200
    # What LiteLLM's spend tracking and budget reset job write (its timestamps: UTC, no zone).
    await pools.litellm.execute('UPDATE "LiteLLM_EndUserTable" SET spend = 0.0625 WHERE user_id = $1', "pg-uid:ai")
    await pools.litellm.execute('UPDATE "LiteLLM_EndUserTable" SET spend = 0.09 WHERE user_id = $1', "other-uid:ai")
    await pools.litellm.execute(
        'UPDATE "LiteLLM_BudgetTable" SET budget_reset_at = $2 WHERE budget_id = $1',
        "end-user-budget-ai",
        datetime(2026, 12, 1, 6, 30),
    )
    response = await pg_service.client.get("/v1/usage", headers=pg_service.headers(), params={"user_id": "other-uid:ai"})
    assert response.status == 200
    assert await response.json() == {
        "service_type": "ai",
        "spend": 0.0625,
        "max_budget": 0.1,
        "remaining_budget": 0.1 - 0.0625,
        "budget_duration": "1d",
        "budget_reset_at": "2026-12-01T06:30:00+00:00",
        "tpm_limit": 2000,
        "rpm_limit": 40,
    }
    newcomer = pg_service.fxa.issue_jwt("newcomer")
    missing = await pg_service.client.get("/v1/usage", headers=pg_service.headers(authorization=f"Bearer {newcomer}"))
    assert missing.status == 404
    assert await pools.litellm.fetchval('SELECT count(*) FROM "LiteLLM_EndUserTable" WHERE user_id = $1', "newcomer:ai") == 0


# A database that swallows every challenge written (a BEFORE INSERT trigger that counts the
# attempt and drops the row): issuance is one statement, so it gives up at once.
_CONSUME_EVERY_CHALLENGE = """
CREATE SEQUENCE challenge_insert_attempts;
CREATE FUNCTION drop_every_challenge() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM nextval('challenge_insert_attempts'); RETURN NULL; END $$;
CREATE TRIGGER drop_every_challenge BEFORE INSERT ON challenges
  FOR EACH ROW EXECUTE FUNCTION drop_every_challenge();
"""
_RESTORE_CHALLENGES = """
DROP TRIGGER IF EXISTS drop_every_challenge ON challenges;
DROP FUNCTION IF EXISTS drop_every_challenge();
DROP SEQUENCE IF EXISTS challenge_insert_attempts;
"""


async def test_a_challenge_the_database_swallows_is_a_logged_500_after_one_statement(
    pg_service: Service, pools: Pools, caplog: pytest.LogCaptureFixture
) -> None:
    await pools.app.execute(_CONSUME_EVERY_CHALLENGE)
    try:
        async with asyncio.timeout(30):
            response = await pg_service.client.get("/verify/challenge", params={"key_id_b64": "a2V5LWlk"})
        assert response.status == 500
        assert await response.json() == {"detail": "Challenge could not be issued"}
        attempts = await pools.app.fetchval("SELECT last_value FROM challenge_insert_attempts")
        assert attempts == 1
    finally:
        await pools.app.execute(_RESTORE_CHALLENGES)
    [failure] = events(caplog, "app_attest_challenge_store_failed")
    assert failure["level"] == "ERROR" and "stored no challenge" in failure["reason"]
    # Without the trigger the same key id gets its challenge.
    again = await pg_service.client.get("/verify/challenge", params={"key_id_b64": "a2V5LWlk"})
    assert again.status == 200
