"""structlog configuration: JSON lines in production, a readable console locally.

Standard-library loggers (aiohttp, asyncio, gunicorn, asyncpg) go through the same
formatter, so every line has one shape. A redaction processor drops message content and
secrets wherever they appear in an event (decision 17).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, MutableMapping

import structlog

from ..wire import loggable

# Keys whose values never reach a log line, at any depth of the event.
REDACTED_KEYS = frozenset(
    {
        "messages",
        "tools",
        "authorization",
        "x-dev-authorization",
        "master_key",
        "master-key",
        "mlpa_ui_access_key",
        "mlpa-ui-access-key",
        "password",
        "cookie",
        "query",
    }
)
REDACTED = "[redacted]"
_MAX_DEPTH = 4


def _redact(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {
            k: (REDACTED if isinstance(k, str) and k.lower() in REDACTED_KEYS else _redact(v, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact(v, depth + 1) for v in value]
    return value


def redact_sensitive(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if key.lower() in REDACTED_KEYS:
            event[key] = REDACTED
        elif isinstance(event[key], (dict, list, tuple)):
            event[key] = _redact(event[key], 1)
    return event


def escape_unprintable(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Client-supplied text (a User-Agent with obs-text bytes, a model name with a control
    character) must neither break the writer's UTF-8 encoding nor forge terminal output."""
    for key, value in event.items():
        if type(value) is str and not value.isprintable():
            event[key] = loggable(value)
    return event


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_sensitive,
        escape_unprintable,
    ]


def configure_logging(*, level: str = "INFO", json: bool = False) -> None:
    """Process-wide logging setup; called by the entry points, never by `create_app`."""
    shared = _shared_processors()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty())
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if json else structlog.processors.StackInfoRenderer(),
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    # We write one canonical line per request ourselves (cancelled ones included), so
    # aiohttp's access log would only duplicate it.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    for name in ("gunicorn.error", "gunicorn.access"):
        gunicorn_logger = logging.getLogger(name)
        gunicorn_logger.handlers = []
        gunicorn_logger.propagate = True
