"""structlog configuration: JSON lines in production, a readable console locally.

Standard-library loggers (aiohttp, asyncio, gunicorn, asyncpg) go through the same
formatter, so every line has one shape. A redaction processor drops message content and
secrets wherever they appear in an event (compatibility.md D17).
"""

from __future__ import annotations

import datetime
import json as jsonlib
import logging
import sys
from typing import Any, MutableMapping, Sequence, TextIO

import structlog

from ..wire import loggable
from . import log_context
from .redaction import NEVER_LOGGED

# Keys whose values never reach a log line, at any depth of the event (redaction.py).
REDACTED_KEYS = NEVER_LOGGED
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
        log_context.merge_fields,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_sensitive,
        escape_unprintable,
    ]


# What a person scans first on a console line, in this order, after level and event.
LEADING_KEYS = ("method", "path", "status", "duration_ms")
_LEVEL_COLOURS = {"DEBUG": "\x1b[2m", "WARNING": "\x1b[33m", "ERROR": "\x1b[31m", "CRITICAL": "\x1b[1;31m"}


class ConsoleLine:
    """`LEVEL event  GET /path 200 12.3ms  key=value ...`: the leading fields bare, every
    other field after them in the order it was bound, a traceback on the lines below."""

    def __init__(self, *, colours: bool = False) -> None:
        self._colours = colours

    def __call__(self, _: Any, __: str, event: MutableMapping[str, Any]) -> str:
        level = str(event.pop("level", "info")).upper()
        message = str(event.pop("event", ""))
        below = [str(text) for text in (event.pop("stack", None), event.pop("exception", None)) if text]
        lead = []
        for key in LEADING_KEYS:
            if key in event:
                value = event.pop(key)
                lead.append(f"{value}ms" if key == "duration_ms" else str(value))
        rest = " ".join(f"{key}={_console_value(value)}" for key, value in event.items())
        shown_level = f"{level:<8}"
        if self._colours and level in _LEVEL_COLOURS:
            shown_level = f"{_LEVEL_COLOURS[level]}{shown_level}\x1b[0m"
        line = " ".join(part for part in (shown_level, message, " ".join(lead)) if part)
        if rest:
            line = f"{line}  {rest}"
        return "\n".join([line, *below])


def _console_value(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if text and " " not in text else repr(text)


def stdlib_formatter(json: bool = False, colours: bool = False) -> logging.Formatter:
    """The formatter of every line, for the standard-library handler. gunicorn's master
    builds it from `logconfig_dict` (config/gunicorn.conf.py); the entry points through
    `configure_logging`."""
    renderer: Any = structlog.processors.JSONRenderer() if json else ConsoleLine(colours=colours)
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
    )


def configure_logging(*, level: str = "INFO", json: bool = False) -> None:
    """Process-wide logging setup; called by the entry points, never by `create_app`."""
    structlog.configure(
        # A line below the level is dropped first, before the context is merged and the
        # event redacted: stdlib logging would drop it only after all of that (at
        # LOG_LEVEL=warning that was every request's canonical line, per request). The
        # filtering wrapper drops it before even building the event (its methods below the
        # level do nothing: 6 µs per call saved against raising DropEvent from
        # `filter_by_level`, which stays for loggers set above the root level).
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(stdlib_formatter(json=json, colours=not json and sys.stdout.isatty()))
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


def log_startup_failure(
    event: str,
    problems: Sequence[str],
    *,
    exit_code: int,
    hint: str,
    json: bool,
    unknown_variables: Sequence[str] = (),
    stream: TextIO | None = None,
) -> None:
    """One message for a process that cannot start: every problem, the exit status and
    what to do, and the environment's names the service does not read (a misspelling is
    often why a variable reads as "not set"), without a traceback."""
    log_problems(
        event, problems, level="critical", outcome=f"exit status {exit_code}", hint=hint, json=json,
        fields={"exit_code": exit_code}, unknown_variables=unknown_variables, stream=stream,
    )


def log_problems(
    event: str,
    problems: Sequence[str],
    *,
    level: str,
    outcome: str,
    hint: str,
    json: bool,
    fields: dict[str, Any] | None = None,
    unknown_variables: Sequence[str] = (),
    logger: str = "mlpa_aiohttp.startup",
    stream: TextIO | None = None,
) -> None:
    """Every problem of a configuration in one message, what came of it (`outcome`), the
    environment's names the service does not read, and what to do. Written directly (it may
    run before `configure_logging`, or in gunicorn's master) in the shape of every other line."""
    out = stream if stream is not None else sys.stderr
    shown_level = level.upper()
    if json:
        record: dict[str, Any] = {"event": event, "problems": list(problems)}
        if unknown_variables:
            record["unknown_variables"] = list(unknown_variables)
        record.update(
            {
                **(fields or {}),
                "hint": hint,
                "level": level.lower(),
                "logger": logger,
                "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z"),
            }
        )
        text = jsonlib.dumps(record)
    elif len(problems) == 1 and not unknown_variables:
        text = f"{shown_level:<8} {event}: {problems[0]} ({outcome}; {hint})"
    else:
        counted = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        lines = [f"{shown_level:<8} {event}: {counted}, {outcome}"]
        lines += [f"  - {problem}" for problem in problems]
        if unknown_variables:
            lines.append("  set, but not variables this service reads:")
            lines += [f"  - {note}" for note in unknown_variables]
        lines.append(f"  {hint}")
        text = "\n".join(lines)
    print(text, file=out, flush=True)
