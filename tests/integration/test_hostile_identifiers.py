"""Control characters in identifiers that reach PostgreSQL (issue 12): refused before they
are issued or stored, so they end in the documented 4xx, never in a 500 from the database."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import AsyncIterator

import pytest

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.auth.access_token import issue_access_token
from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.store.base import InvalidIdentifier
from mlpa_aiohttp.store.pools import Pools
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from mlpa_aiohttp.testing.litellm_schema import EndUserTable
from tests.support.fake_google import FakeGoogle, make_verdict

from ..conftest import TEST_SECRETS, Service, chat_body, make_settings
from .conftest import StoreUnderTest
from tests.support.postgres import database_environ

pytestmark = pytest.mark.postgres

MASTER = {"master_key": f"Bearer {TEST_SECRETS['MASTER_KEY']}"}
BAD_IDS = ["nul\x00id", "cr\rid", "esc\x1bid", "c1\x9bid"]


@pytest.fixture
async def google(tmp_path: Path, google_service_account_key) -> AsyncIterator[FakeGoogle]:
    fake = FakeGoogle(private_key=google_service_account_key)
    async with fake.serve():
        fake.credentials_file = fake.write_service_account_file(tmp_path / "sa.json")
        yield fake


@pytest.fixture
async def pg_service(
    aiohttp_client, aiohttp_server, litellm_table: EndUserTable, pg_settings: PostgresSettings, google: FakeGoogle,
    fxa_signing_key,
) -> Service:
    litellm = FakeLiteLLM(
        virtual_key=TEST_SECRETS["MLPA_VIRTUAL_KEY"],
        master_key=TEST_SECRETS["MASTER_KEY"],
        customer_table=litellm_table,
    )
    fxa = FakeFxA(first_key=fxa_signing_key)
    settings = make_settings(
        str((await aiohttp_server(litellm.make_app())).make_url("")).rstrip("/"),
        str((await aiohttp_server(fxa.make_app())).make_url("/v1")),
        PLAY_INTEGRITY_API_BASE=google.base_url,
        PLAY_INTEGRITY_CREDENTIALS_FILE=str(google.credentials_file),
        **database_environ(pg_settings),
    )
    app = create_app(settings)
    return Service(client=await aiohttp_client(app), litellm=litellm, fxa=fxa, app=app, token=fxa.issue_jwt("pg-uid"))


@pytest.mark.parametrize("user_id", BAD_IDS)
async def test_play_user_id_with_control_characters_is_400_and_nothing_is_stored(
    pg_service: Service, google: FakeGoogle, pools: Pools, user_id: str
) -> None:
    google.verdicts["tok"] = make_verdict("anyone")
    response = await pg_service.client.post("/verify/play", data=json.dumps({"integrity_token": "tok", "user_id": user_id}))
    assert (response.status, await response.json()) == (400, {"detail": "Invalid user_id"})
    assert await pools.litellm.fetchval('SELECT count(*) FROM "LiteLLM_EndUserTable"') == 0


@pytest.mark.parametrize("user_id", BAD_IDS)
async def test_an_already_issued_token_with_such_a_user_id_is_401(pg_service: Service, user_id: str) -> None:
    secret = pg_service.app[keys.SETTINGS].auth.access_token_secret
    token = issue_access_token(secret, user_id, 3600, time.time())
    headers = {"authorization": f"Bearer {token}", "service-type": "ai", "use-play-integrity": "true"}
    for _ in range(2):
        response = await pg_service.chat(chat_body(), headers=headers)
        assert (response.status, await response.json()) == (401, {"detail": "Invalid MLPA access token"})


@pytest.mark.parametrize("action", ["block", "unblock", "budget"])
async def test_admin_user_id_with_a_nul_is_404(pg_service: Service, action: str) -> None:
    response = await pg_service.client.post(
        f"/user/nul%00id:ai/{action}", data=json.dumps({"service_type": "ai"}), headers=MASTER
    )
    assert (response.status, await response.json()) == (404, {"detail": "User not found."})


@pytest.mark.parametrize("user_id", [f"{bad}:ai" for bad in BAD_IDS] + ["lone\ud800:ai"])
async def test_stores_never_find_or_create_such_ids(any_store: StoreUnderTest, user_id: str) -> None:
    store = any_store.store
    assert await store.get_user(user_id) is None
    assert await store.set_blocked(user_id, True) is None
    assert await store.set_budget(user_id, "end-user-budget-ai") is None
    with pytest.raises(InvalidIdentifier):
        await store.create_user(user_id, "end-user-budget-ai")
    assert any_store.calls == []
