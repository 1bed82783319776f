"""App Attest challenges and keys: the Postgres stores and their in-memory twins agree."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from mlpa_aiohttp.store.app_attest import (
    ChallengeStore,
    MemoryChallengeStore,
    MemoryPublicKeyStore,
    PostgresChallengeStore,
    PostgresPublicKeyStore,
    PublicKeyStore,
)
from mlpa_aiohttp.store.pools import Pools

pytestmark = pytest.mark.postgres

EXPIRY_SECONDS = 300
PEM = "-----BEGIN PUBLIC KEY-----\nMFkw...\n-----END PUBLIC KEY-----\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class AttestStores:
    challenges: ChallengeStore
    keys: PublicKeyStore
    clock: FakeClock


@pytest.fixture(params=["memory", "postgres"])
def stores(request: pytest.FixtureRequest) -> AttestStores:
    clock = FakeClock()
    if request.param == "memory":
        return AttestStores(MemoryChallengeStore(EXPIRY_SECONDS, clock), MemoryPublicKeyStore(), clock)
    pools: Pools = request.getfixturevalue("pools")
    return AttestStores(PostgresChallengeStore(pools.app, EXPIRY_SECONDS, clock), PostgresPublicKeyStore(pools.app), clock)


async def test_challenge_is_64_hex_and_reserved_while_fresh(stores: AttestStores) -> None:
    first = await stores.challenges.issue("key+1/=")
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    stores.clock.advance(EXPIRY_SECONDS)  # age == expiry still counts as fresh
    assert await stores.challenges.issue("key+1/=") == first
    assert await stores.challenges.issue("other-key") != first
    stores.clock.advance(1)
    renewed = await stores.challenges.issue("key+1/=")
    assert renewed != first and re.fullmatch(r"[0-9a-f]{64}", renewed)


async def test_challenge_is_single_use(stores: AttestStores) -> None:
    challenge = await stores.challenges.issue("k")
    assert await stores.challenges.consume("k", challenge) is True
    assert await stores.challenges.consume("k", challenge) is False


async def test_wrong_guess_burns_the_challenge(stores: AttestStores) -> None:
    challenge = await stores.challenges.issue("k")
    assert await stores.challenges.consume("k", "0" * 64) is False
    assert await stores.challenges.consume("k", challenge) is False
    assert await stores.challenges.issue("k") != challenge


async def test_stale_or_unknown_challenge_is_rejected(stores: AttestStores) -> None:
    challenge = await stores.challenges.issue("k")
    stores.clock.advance(EXPIRY_SECONDS + 1)
    assert await stores.challenges.consume("k", challenge) is False
    assert await stores.challenges.consume("never-issued", challenge) is False
    assert await stores.challenges.consume("k", "ünïcode") is False


async def test_concurrent_issues_for_one_key_agree(stores: AttestStores) -> None:
    issued = await asyncio.gather(*(stores.challenges.issue("k") for _ in range(10)))
    assert len(set(issued)) == 1


async def test_concurrent_consumes_succeed_once(stores: AttestStores) -> None:
    challenge = await stores.challenges.issue("k")
    results = await asyncio.gather(*(stores.challenges.consume("k", challenge) for _ in range(10)))
    assert results.count(True) == 1


async def test_public_key_store_and_counter(stores: AttestStores) -> None:
    keys = stores.keys
    assert await keys.get_key("k") is None
    assert await keys.advance_counter("k", 1) is False
    await keys.store_key("k", PEM, 0)
    assert await keys.get_key("k") == (PEM, 0)
    assert await keys.advance_counter("k", 0) is False  # equal is a replay
    assert await keys.advance_counter("k", 5) is True
    assert await keys.advance_counter("k", 3) is False
    assert await keys.get_key("k") == (PEM, 5)
    await keys.store_key("k", PEM + "x", 0)  # re-attestation replaces key and counter
    assert await keys.get_key("k") == (PEM + "x", 0)


async def test_concurrent_assertions_with_one_counter_pass_once(stores: AttestStores) -> None:
    await stores.keys.store_key("k", PEM, 1)
    results = await asyncio.gather(*(stores.keys.advance_counter("k", 2) for _ in range(20)))
    assert results.count(True) == 1
    assert await stores.keys.get_key("k") == (PEM, 2)
