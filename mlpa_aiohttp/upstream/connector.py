"""The upstream connector: aiohttp's TCPConnector without a thread hop per new connection.

aiohttp connects through aiohappyeyeballs, which calls `loop.sock_connect(sock, address)`
with an address that is already numeric. uvloop's `sock_connect` resolves it once more with
`getaddrinfo` *without a socket type*, which misses uvloop's numeric fast path and goes
through libuv's thread pool: a futex wake and an eventfd write before every `connect`, about
0.3 ms of latency per new upstream connection (docs/performance.md, "Admission"). Every new
stream in a burst pays it, because open streams hold every pooled connection.

When there is exactly one address to try (an IP-literal LITELLM_API_BASE, or a name that
resolved to one address) and no TLS, there is nothing for Happy Eyeballs to race: the
connection is made with `loop.create_connection(host=<numeric>, ...)`, whose resolution of
a numeric host is done inline by both uvloop and asyncio. Everything else (several
addresses, TLS, local address binding) takes aiohttp's own path unchanged. Errors map to
the same `ClientConnectorError` aiohttp raises.

It overrides a private method (`TCPConnector._wrap_create_connection`) and reads private
attributes, so `make_connector` checks once, when the session is made, that the running
aiohttp is one it was tested on and has them (aiohttp_internals.py); otherwise the session
gets aiohttp's own `TCPConnector`, with one WARNING.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

from ..aiohttp_internals import fence, missing_attributes

# What the override takes from aiohttp's own `_wrap_create_connection`, by keyword.
_OVERRIDDEN_PARAMETERS = ("addr_infos", "req", "timeout", "client_error")
# What it reads on the connector.
_READ_ATTRIBUTES = ("_local_addr_infos", "_socket_factory", "_loop")


def make_connector(*, version: str | None = None, **kwargs: Any) -> aiohttp.TCPConnector:
    """A `DirectConnector` if the running aiohttp (`version` stands in for it in tests)
    allows it, else aiohttp's own `TCPConnector`; `kwargs` are TCPConnector's."""
    connector = DirectConnector(**kwargs)
    if fence("direct upstream connector", missing_internals(aiohttp.TCPConnector, connector), version=version):
        return connector
    # Nothing was opened yet: the unused connector holds no connection to close.
    return aiohttp.TCPConnector(**kwargs)


def missing_internals(base: type, connector: object) -> list[str]:
    """What the override needs and `base` (its parent class) or `connector` lacks."""
    missing = missing_attributes(connector, _READ_ATTRIBUTES)
    original = getattr(base, "_wrap_create_connection", None)
    if original is None:
        return [*missing, f"{base.__name__}._wrap_create_connection"]
    parameters = inspect.signature(original).parameters
    return missing + [f"_wrap_create_connection({name}=)" for name in _OVERRIDDEN_PARAMETERS if name not in parameters]


class DirectConnector(aiohttp.TCPConnector):
    async def _wrap_create_connection(  # type: ignore[override]
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
                return await self._loop.create_connection(  # type: ignore[return-value]
                    *args, host=address[0], port=address[1], family=family, proto=proto, **kwargs
                )
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise
            raise client_error(req.connection_key, exc) from exc

