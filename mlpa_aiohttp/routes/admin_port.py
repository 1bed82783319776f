"""The operators' routes on a listener of their own (MLPA_ADMIN_PORT, compatibility.md D59).

With MLPA_ADMIN_PORT set, the process listens on PORT and on MLPA_ADMIN_PORT with one app
(gunicorn binds both, `serve` opens both), and this middleware keeps each listener to its
routes, by the local port of the request's connection:

* the public port answers 404 (the body of any unknown path) for the operators' paths:
  `/metrics`, `/admin`, `/user/*`, `/api/docs` (with its static files) and `/openapi.json`;
* the admin port serves those and answers 404 for the clients' routes;
* both serve the health routes (the kubelet probes the public port).

The paths are compared before routing decides anything, so a wrong method or an unknown
path under an operator's prefix is a 404 on the public port too, not a 405 that would tell
the route exists. Unset, there is no middleware and everything is on PORT, as the reference.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..middlewares import Handler

# Each with everything below it (`/user/{user_id}/budget`, `/api/docs/static/...`).
ADMIN_PATHS = ("/metrics", "/admin", "/user", "/api/docs", "/openapi.json")
BOTH_PATHS = ("/health",)


class _PathSet:
    """Paths and everything below them; one set lookup and one `startswith` per test (this
    runs for every request)."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self._exact = frozenset(paths)
        self._below = tuple(path + "/" for path in paths)

    def __contains__(self, path: str) -> bool:
        return path in self._exact or path.startswith(self._below)


_ADMIN = _PathSet(ADMIN_PATHS)
_BOTH = _PathSet(BOTH_PATHS)


def is_admin_path(path: str) -> bool:
    return path in _ADMIN


def _local_port(request: web.Request) -> int | None:
    transport = request.transport
    if transport is None:  # the connection is gone; nothing will be sent anyway
        return None
    sockname = transport.get_extra_info("sockname")
    return sockname[1] if isinstance(sockname, tuple) else None


def listener_split(admin_port: int) -> Middleware:
    """The middleware for an app served on PORT and on `admin_port`."""

    @web.middleware
    async def split_by_listener(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path not in _BOTH and (path in _ADMIN) != (_local_port(request) == admin_port):
            raise web.HTTPNotFound()
        return await handler(request)

    return split_by_listener
