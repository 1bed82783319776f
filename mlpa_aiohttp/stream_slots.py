"""Open streams per identity: `MAX_CONCURRENT_STREAMS_PER_USER` (off when 0).

One counter per identity (`uid:service_type`) in a dict owned by the worker's event loop.
`try_take` and `give_back` are plain functions, never coroutines, so nothing can run between
the check and the increment: the count is exact within a worker without a lock.

Across gunicorn workers the state is not shared: a pod admits at most `workers x limit`
streams per identity (one worker per pod is the default, so the bound is then exact). That
is enough for what the cap is for, keeping one identity from holding an unbounded share of a
worker's upstream connections and memory; the spend and rate limits that matter across pods
are LiteLLM's, which are global. Shared state would put a cross-process round trip on every
stream's start and a leak risk on every worker crash, for a bound that is a small multiple
anyway.
"""

from __future__ import annotations


class StreamSlots:
    __slots__ = ("limit", "_held")

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no cap
        self._held: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def try_take(self, identity: str) -> bool:
        held = self._held.get(identity, 0)
        if held >= self.limit:
            return False
        self._held[identity] = held + 1
        return True

    def give_back(self, identity: str) -> None:
        held = self._held[identity] - 1
        if held:
            self._held[identity] = held
        else:
            # No entry per identity that holds nothing: the dict stays as small as the
            # number of identities streaming right now.
            del self._held[identity]

    def __len__(self) -> int:
        """Identities holding at least one slot."""
        return len(self._held)
