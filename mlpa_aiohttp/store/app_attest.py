"""App Attest state: single-use challenges and device public keys with their counters.

Two implementations with one behaviour: Postgres (tables `challenges`, `public_keys` in
the app database) and in-memory (the demo). Database failures raise `StoreUnavailable`;
the routes decide what a failure means to the client.

Time is the application's clock (injectable for tests): a challenge's `created_at` is
written from it and its age measured against it, so a skewed database clock cannot make
challenges expire early or late.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import asyncpg

from .base import StoreUnavailable
from .pools import db_errors

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_challenge() -> str:
    """32 random bytes as 64 lowercase hex characters."""
    return secrets.token_hex(32)


def _challenge_matches(stored: str | None, created_at: datetime | None, offered: str, now: datetime, expiry: timedelta) -> bool:
    if stored is None or created_at is None:
        return False
    fresh = now - created_at <= expiry
    # Constant-time on bytes: compare_digest rejects non-ASCII str.
    equal = hmac.compare_digest(stored.encode("utf-8"), offered.encode("utf-8", "surrogatepass"))
    return fresh and equal


class ChallengeStore(Protocol):
    async def issue(self, key_id_b64: str) -> str:
        """The key id's fresh challenge if there is one, else a new one (stored)."""
        ...

    async def consume(self, key_id_b64: str, challenge: str) -> bool:
        """Delete the key id's challenge (always: a wrong guess burns it too); true only
        if it existed, was fresh and equals `challenge`."""
        ...


class PublicKeyStore(Protocol):
    async def store_key(self, key_id_b64: str, public_key_pem: str, counter: int) -> None:
        """Insert or replace (a re-attestation resets the counter)."""
        ...

    async def get_key(self, key_id_b64: str) -> tuple[str, int] | None: ...

    async def advance_counter(self, key_id_b64: str, new_counter: int) -> bool:
        """Set the counter only if `new_counter` is strictly greater; atomic, so two
        concurrent assertions with the same counter cannot both succeed."""
        ...


# -- Postgres ----------------------------------------------------------------------


class PostgresChallengeStore:
    def __init__(self, pool: asyncpg.Pool, expiry_seconds: int, clock: Clock = utc_now) -> None:
        self._pool = pool
        self._expiry = timedelta(seconds=expiry_seconds)
        self._clock = clock

    async def issue(self, key_id_b64: str) -> str:
        now = self._clock()
        with db_errors("issue challenge"):
            # One statement, so no consume can slip in between a write and a read: insert,
            # or keep the fresh challenge (a no-op update, so the row comes back), or
            # replace a stale one. ON CONFLICT DO UPDATE always yields the row in force,
            # also when a concurrent consume deletes the conflicting row (it inserts then).
            issued = await self._pool.fetchval(
                "INSERT INTO challenges AS c (key_id_b64, challenge, created_at) VALUES ($1, $2, $3)"
                " ON CONFLICT (key_id_b64) DO UPDATE SET"
                "   challenge = CASE WHEN c.challenge IS NULL OR c.created_at IS NULL OR c.created_at < $4"
                "     THEN EXCLUDED.challenge ELSE c.challenge END,"
                "   created_at = CASE WHEN c.challenge IS NULL OR c.created_at IS NULL OR c.created_at < $4"
                "     THEN EXCLUDED.created_at ELSE c.created_at END"
                " RETURNING challenge",
                key_id_b64,
                new_challenge(),
                now,
                now - self._expiry,
            )
        if issued is None:
            # Only something outside the service (a trigger, a rule) can swallow the row.
            raise StoreUnavailable("issue challenge: the database stored no challenge")
        return str(issued)

    async def consume(self, key_id_b64: str, challenge: str) -> bool:
        with db_errors("consume challenge"):
            row = await self._pool.fetchrow(
                "DELETE FROM challenges WHERE key_id_b64 = $1 RETURNING challenge, created_at", key_id_b64
            )
        if row is None:
            return False
        return _challenge_matches(row["challenge"], row["created_at"], challenge, self._clock(), self._expiry)


class PostgresPublicKeyStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def store_key(self, key_id_b64: str, public_key_pem: str, counter: int) -> None:
        with db_errors("store public key"):
            await self._pool.execute(
                "INSERT INTO public_keys (key_id_b64, public_key_pem, counter, created_at, updated_at)"
                " VALUES ($1, $2, $3, NOW(), NOW())"
                " ON CONFLICT (key_id_b64) DO UPDATE SET public_key_pem = EXCLUDED.public_key_pem,"
                "   counter = EXCLUDED.counter, updated_at = NOW()",
                key_id_b64,
                public_key_pem,
                counter,
            )

    async def get_key(self, key_id_b64: str) -> tuple[str, int] | None:
        with db_errors("get public key"):
            row = await self._pool.fetchrow(
                "SELECT public_key_pem, counter FROM public_keys WHERE key_id_b64 = $1", key_id_b64
            )
        if row is None or row["public_key_pem"] is None:
            return None
        return row["public_key_pem"], int(row["counter"])

    async def advance_counter(self, key_id_b64: str, new_counter: int) -> bool:
        with db_errors("advance counter"):
            updated = await self._pool.fetchval(
                "UPDATE public_keys SET counter = $2, updated_at = NOW()"
                " WHERE key_id_b64 = $1 AND counter < $2 RETURNING true",
                key_id_b64,
                new_counter,
            )
        return bool(updated)


# -- in memory (demo) ----------------------------------------------------------------


@dataclass(slots=True)
class _StoredChallenge:
    challenge: str
    created_at: datetime


class MemoryChallengeStore:
    def __init__(self, expiry_seconds: int, clock: Clock = utc_now) -> None:
        self._expiry = timedelta(seconds=expiry_seconds)
        self._clock = clock
        self._challenges: dict[str, _StoredChallenge] = {}

    async def issue(self, key_id_b64: str) -> str:
        now = self._clock()
        stored = self._challenges.get(key_id_b64)
        if stored is not None and now - stored.created_at <= self._expiry:
            return stored.challenge
        stored = _StoredChallenge(new_challenge(), now)
        self._challenges[key_id_b64] = stored
        return stored.challenge

    async def consume(self, key_id_b64: str, challenge: str) -> bool:
        stored = self._challenges.pop(key_id_b64, None)
        if stored is None:
            return False
        return _challenge_matches(stored.challenge, stored.created_at, challenge, self._clock(), self._expiry)


class MemoryPublicKeyStore:
    def __init__(self) -> None:
        self._keys: dict[str, tuple[str, int]] = {}

    async def store_key(self, key_id_b64: str, public_key_pem: str, counter: int) -> None:
        self._keys[key_id_b64] = (public_key_pem, counter)

    async def get_key(self, key_id_b64: str) -> tuple[str, int] | None:
        return self._keys.get(key_id_b64)

    async def advance_counter(self, key_id_b64: str, new_counter: int) -> bool:
        stored = self._keys.get(key_id_b64)
        if stored is None or stored[1] >= new_counter:
            return False
        self._keys[key_id_b64] = (stored[0], new_counter)
        return True
