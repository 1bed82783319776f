"""iOS's normal traffic on PostgreSQL: a fresh challenge for every request, several requests
of one key in flight at once, over real HTTP (the iOS emulation of tests/clients/ios.py).

Challenges are one per key id: concurrent fetches for one key get the one in force, and the
first assertion to spend it wins. The others are a clean 401, never a 5xx."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from tests.clients.ios import IOSApp
from tests.support.app_attest_device import TestAttestationCA, TestDevice

from ..conftest import Service
from .conftest import PgServiceFactory

pytestmark = pytest.mark.postgres

TEAM = "TESTTEAM01"  # an Apple-shaped team id; TEAMID1234, the reference default, is refused outside debug
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
async def ios_service(make_pg_service: PgServiceFactory, tmp_path: Path) -> tuple[Service, TestAttestationCA]:
    ca = TestAttestationCA()
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    service = await make_pg_service(APP_ATTEST_ROOT_CA_PATH=str(root), APP_DEVELOPMENT_TEAM=TEAM)
    return service, ca


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
