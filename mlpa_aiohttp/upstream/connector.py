"""The upstream connector: aiohttp's TCPConnector that tells a request whether its
connection came from the pool, and makes new connections without a thread hop.

Pooled or new (`PoolAwareConnector`, public API only): the stale keep-alive re-send
(upstream/litellm.py) is only safe on a *reused* connection. aiohttp reports reuse through a
`TraceConfig`, but a session with one traces every request through about ten signals (a
params object and an await each), 4 % of a new stream's instructions (callgrind). Instead
the connector's `connect` notes it on the `ConnectionUse` the request's task set
(`watching_connection`), a context variable: the caller reads it when the request failed.

The thread hop (`DirectConnector`):

aiohttp connects through aiohappyeyeballs, which calls `loop.sock_connect(sock, address)`
with an address that is already numeric. uvloop's `sock_connect` resolves it once more with
`getaddrinfo` *without a socket type*, which misses uvloop's numeric fast path and goes
through libuv's thread pool: a futex wake and an eventfd write before every `connect`, about
0.3 ms of latency per new upstream connection (docs/performance.md, "The burst and the
listen backlog"). Every new stream in a burst pays it, because open streams hold every
pooled connection.

When there is exactly one address to try (an IP-literal LITELLM_API_BASE, or a name that
resolved to one address) and no TLS, there is nothing for Happy Eyeballs to race: the
connection is made with `loop.create_connection(host=<numeric>, ...)`, whose resolution of
a numeric host is done inline by both uvloop and asyncio. Everything else (several
addresses, TLS, local address binding) takes aiohttp's own path unchanged. Errors map to
the same `ClientConnectorError` aiohttp raises.

It overrides a private method (`TCPConnector._wrap_create_connection`) and reads private
attributes, so `make_connector` checks once, when the session is made, that the running
aiohttp is one it was tested on and has them (process/aiohttp_internals.py); otherwise the session
gets aiohttp's own `TCPConnector`, with one WARNING.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

from ..process.aiohttp_internals import fence, missing_attributes

# What the override takes from aiohttp's own `_wrap_create_connection`, by keyword.
_OVERRIDDEN_PARAMETERS = ("addr_infos", "req", "timeout", "client_error")
# What it reads on the connector.
_READ_ATTRIBUTES = ("_local_addr_infos", "_socket_factory", "_loop")


class ConnectionUse:
    """What one request's connection was; set by the connector once it has one."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


_CONNECTION_USE: ContextVar[ConnectionUse | None] = ContextVar("mlpa_upstream_connection_use", default=None)


@contextmanager
def watching_connection() -> Iterator[ConnectionUse]:
    """Around one request: what its connection was (through a `PoolAwareConnector`)."""
    use = ConnectionUse()
    token = _CONNECTION_USE.set(use)
    try:
        yield use
    finally:
        _CONNECTION_USE.reset(token)


def make_connector(*, version: str | None = None, **kwargs: Any) -> PoolAwareConnector:
    """A `DirectConnector` if the running aiohttp (`version` stands in for it in tests)
    allows it, else a `PoolAwareConnector` (aiohttp's own connection path); `kwargs` are
    TCPConnector's."""
    connector = DirectConnector(**kwargs)
    if fence("direct upstream connector", missing_internals(PoolAwareConnector, connector), version=version):
        return connector
    # Nothing was opened yet: the unused connector holds no connection to close.
    return PoolAwareConnector(**kwargs)


def missing_internals(base: type, connector: object) -> list[str]:
    """What the override needs and `base` (its parent class) or `connector` lacks."""
    missing = missing_attributes(connector, _READ_ATTRIBUTES)
    original = getattr(base, "_wrap_create_connection", None)
    if original is None:
        return [*missing, f"{base.__name__}._wrap_create_connection"]
    parameters = inspect.signature(original).parameters
    return missing + [f"_wrap_create_connection({name}=)" for name in _OVERRIDDEN_PARAMETERS if name not in parameters]


class PoolAwareConnector(aiohttp.TCPConnector):
    """Notes on the request's `ConnectionUse` whether the connection it got had served
    a request before (a connection is handed out once per request it serves)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        use = _CONNECTION_USE.get()
        if use is not None:
            use.reused = protocol in self._handed_out
        if protocol is not None:
            self._handed_out.add(protocol)
        return connection


class DirectConnector(PoolAwareConnector):
    async def _wrap_create_connection(
        self,
        *args: Any,
        addr_infos: list[Any],
        req: Any,
        timeout: aiohttp.ClientTimeout,
        client_error: type[Exception] = aiohttp.ClientConnectorError,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, ResponseHandler]:
        if len(addr_infos) != 1 or kwargs.get("ssl") or self._local_addr_infos or self._socket_factory is not None:
            return await super()._wrap_create_connection(
                *args, addr_infos=addr_infos, req=req, timeout=timeout, client_error=client_error, **kwargs
            )
        family, _type, proto, _name, address = addr_infos[0]
        kwargs.pop("ssl", None)
        kwargs.pop("server_hostname", None)  # only meaningful with TLS
        try:
            async with asyncio.timeout(timeout.sock_connect):
                return await self._loop.create_connection(  # type: ignore[call-overload]  # the factory is in *args
                    *args, host=address[0], port=address[1], family=family, proto=proto, **kwargs
                )
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise
            raise client_error(req.connection_key, exc) from exc

