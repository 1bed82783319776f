"""State the fleet shares through Redis: one link per worker (`redis_link.py`) and the
features built on it. Every feature here has a fallback for a Redis that is down or slow, so
Redis failing never fails a request."""

from __future__ import annotations

from ..settings import Settings


def fleet_stream_cap_enabled(settings: Settings) -> bool:
    """STREAM_CAP_SCOPE=fleet with a cap set."""
    return settings.stream_cap.scope == "fleet" and settings.stream_limits.max_concurrent_streams_per_user > 0


def uses_redis(settings: Settings) -> bool:
    """Whether any feature of these settings needs the worker's Redis link."""
    return settings.traffic_contracts.enabled or fleet_stream_cap_enabled(settings)
