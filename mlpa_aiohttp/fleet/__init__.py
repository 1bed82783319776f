"""State the fleet shares through Redis: one link per worker (`redis_link.py`) and the
features built on it. Every feature here has a fallback for a Redis that is down or slow, so
Redis failing never fails a request."""
