"""Every typed `web.AppKey` of the application, on one screen.

Only assembly (`app.py`), routes and middlewares read these; the layers below receive
their collaborators as arguments.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from .settings import Settings
from .store.base import UserStore

SETTINGS = web.AppKey("settings", Settings)
HTTP_SESSION = web.AppKey("http_session", aiohttp.ClientSession)
STORE = web.AppKey("store", UserStore)

# Appended by the Postgres layer: the two asyncpg pools (`store.pools.postgres_ctx`).
from .store.pools import Pools  # noqa: E402  (kept beside its key)

PG_POOLS = web.AppKey("pg_pools", Pools)
