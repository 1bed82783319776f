"""aiohttp's server logger, minus the noise of clients that do not speak HTTP.

aiohttp answers a request its parser refuses (a bare CR, Content-Length with chunked, a
NUL in a header...) with a 400 itself, before any middleware runs, and logs it through
the server's `logger` as an ERROR with a traceback. That is the client's fault, not
ours: it becomes one WARNING without a traceback, counted in
`mlpa_bad_http_requests_total{reason}` (reason = aiohttp's parser error class, a small
fixed set). The parser's message is not logged: it quotes the raw request bytes, which
may hold a credential. Everything else goes to aiohttp's logger unchanged.

Installed per application through `handler_args` (see `app.create_app`), so gunicorn's
worker, `run_app` and the test server all use it.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger

from .metrics import Metrics

log = structlog.get_logger("mlpa_aiohttp.server")


class ServerLogger(logging.LoggerAdapter):
    def __init__(self, metrics: Metrics) -> None:
        super().__init__(server_logger, {})
        self._metrics = metrics

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if self._client_fault(exc_info, log.warning):
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        # aiohttp logs a non-HTTP first line (TLS to a plain port, scanners) at DEBUG.
        if self._client_fault(kwargs.get("exc_info"), log.debug):
            return
        super().debug(msg, *args, **kwargs)

    def _client_fault(self, exc_info: Any, emit: Any) -> bool:
        if not isinstance(exc_info, HttpProcessingError):
            return False
        reason = type(exc_info).__name__
        self._metrics.bad_http_requests.labels(reason).inc()
        emit("bad_http_request", reason=reason, status=exc_info.code)
        return True
