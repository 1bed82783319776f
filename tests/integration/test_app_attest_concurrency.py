"""iOS's normal traffic on PostgreSQL: a fresh challenge for every request, several requests
of one key in flight at once, over real HTTP (the iOS emulation of tests/clients/ios.py).

Challenges are one per key id: concurrent fetches for one key get the one in force, and the
first assertion to spend it wins. The others are a clean 401, never a 5xx."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.settings import PostgresSettings
from mlpa_aiohttp.store.pools import Pools
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from tests.clients.ios import IOSApp
from tests.support.app_attest_device import TestAttestationCA, TestDevice
from tests.support.postgres import LiteLLMTableCustomerCreator

from ..conftest import TEST_SECRETS, Service, make_settings
from tests.support.postgres import database_environ

pytestmark = pytest.mark.postgres

TEAM = "TEAMID1234"
BUNDLE = "org.mozilla.ios.Firefox"
CLIENTS = 6
ROUNDS = 12
# Every answer the service may give a request of this traffic (compatibility.md §1.4, §2.5).
DOCUMENTED = {
    (200, None),
    (401, "Invalid or expired challenge"),  # another request of the key spent the challenge
    (401, "Invalid App Attest assertion"),  # a later counter of the key was accepted first
}


@pytest.fixture
async def ios_service(
    aiohttp_client, aiohttp_server, pools: Pools, pg_settings: PostgresSettings, tmp_path: Path
) -> AsyncIterator[tuple[Service, TestAttestationCA]]:
    ca = TestAttestationCA()
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    litellm = FakeLiteLLM(
        virtual_key=TEST_SECRETS["MLPA_VIRTUAL_KEY"],
        master_key=TEST_SECRETS["MASTER_KEY"],
        customer_sink=LiteLLMTableCustomerCreator(pools.litellm),
    )
    fxa = FakeFxA()
    litellm_server = await aiohttp_server(litellm.make_app())
    fxa_server = await aiohttp_server(fxa.make_app())
    settings = make_settings(
        str(litellm_server.make_url("")).rstrip("/"),
        str(fxa_server.make_url("/v1")),
        APP_ATTEST_ROOT_CA_PATH=str(root),
        APP_DEVELOPMENT_TEAM=TEAM,
        **database_environ(pg_settings),
    )
    app = create_app(settings)
    client = await aiohttp_client(app)
    yield Service(client=client, litellm=litellm, fxa=fxa, app=app), ca


async def _round(app: IOSApp, session: aiohttp.ClientSession) -> tuple[int, str | None]:
    """One request as the app makes it: a fresh challenge, the signed body, the answer."""
    payload = app.summary_payload("A page about foxes.")
    payload["stream"] = False  # the JSON answer: one status and body to classify
    body, headers = await app.signed_request(session, payload)
    async with session.post(f"{app.base_url}/v1/chat/completions", data=body, headers=headers) as response:
        answer = await response.json()
        return response.status, None if response.status == 200 else answer.get("detail")


async def test_concurrent_rounds_of_one_key_never_answer_5xx(ios_service) -> None:
    service, ca = ios_service
    app = IOSApp(str(service.client.make_url("")).rstrip("/"), TestDevice(ca, TEAM, BUNDLE))
    outcomes: Counter[tuple[int, str | None]] = Counter()
    async with aiohttp.ClientSession() as session:
        await app.perform_attestation(session)

        async def client() -> None:
            for _ in range(ROUNDS):
                outcomes[await _round(app, session)] += 1

        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    assert set(outcomes) <= DOCUMENTED, outcomes
    assert outcomes[(200, None)] >= 1, outcomes
    assert sum(outcomes.values()) == CLIENTS * ROUNDS
