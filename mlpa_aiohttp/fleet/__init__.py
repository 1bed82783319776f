"""State the fleet shares through Redis: one link per worker (`redis_link.py`) and the
features built on it. Every feature here has a fallback for a Redis that is down or slow, so
Redis failing never fails a request."""

from __future__ import annotations

from ..settings import Settings


def uses_redis(settings: Settings) -> bool:
    """Whether a feature of this configuration needs the worker's Redis link (app.py opens it
    only then: a service that needs no Redis never contacts one)."""
    return settings.traffic_contracts.enabled
