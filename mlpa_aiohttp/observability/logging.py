"""structlog configuration: JSON lines in production, a readable console locally.

A structlog event's way: `drop_below_level` -> the request's fields (`log_context`) ->
`Stamp` (level, logger, time) -> `scrub` (secrets and message content hidden wherever they
appear, compatibility.md D17; unprintable text escaped) -> `EventWriter`, which hands the
finished dict to the standard-library logger of the same name as one standard record ->
the root handler, whose `LineFormatter` only renders it. Standard-library loggers
(aiohttp, asyncio, gunicorn, asyncpg) reach the same formatter, which runs the same steps
on their records first, so every line has one shape.

Every request writes one line at INFO (the default level), so the path is kept short:
docs/performance.md ("New streams") counts it.
"""

from __future__ import annotations

import json as jsonlib
import logging
import sys
import time
from collections.abc import MutableMapping, Sequence
from typing import Any, TextIO

import orjson
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


_CONTAINERS = (dict, list, tuple)


def _nothing_to_escape_or_walk(values: Any) -> bool:
    """The usual line: text all printable, no structure that could hold a redacted name
    (a list of plain values, such as `tool_names`, holds none)."""
    for value in values:
        kind = type(value)
        if kind is str:
            if not value.isprintable():
                return False
        elif kind is list:
            for item in value:
                if isinstance(item, _CONTAINERS):
                    return False
        elif kind is not int and kind is not float and isinstance(value, _CONTAINERS):
            return False
    return True


def scrub(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Every field named in REDACTED_KEYS hidden, in any letter case and at any depth;
    client-supplied text (a User-Agent with obs-text bytes, a model name with a control
    character) escaped, so it can neither break the writer's UTF-8 encoding nor forge
    terminal output.

    This runs for every line, and a request's line has some 25 fields: the usual line
    (nothing to escape or walk; names that are their own lowercase, none redacted) is
    found in one look at the values and two whole-event operations on the names."""
    if not _nothing_to_escape_or_walk(event.values()):
        for key, value in event.items():
            if type(value) is str:
                if not value.isprintable():
                    event[key] = loggable(value)
            elif isinstance(value, _CONTAINERS):
                event[key] = _redact(value, 1)
    names = event.keys()
    joined = "".join(names)
    if not names.isdisjoint(REDACTED_KEYS) or joined.lower() != joined:
        for key in names:
            if key.lower() in REDACTED_KEYS:
                event[key] = REDACTED
    return event


# structlog's method names that are not the level's own (`add_log_level` maps them too).
_LEVEL_ALIASES = {"warn": "warning", "exception": "error"}
_LEVEL_NUMBERS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
                  "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL}


def drop_below_level(logger: Any, method_name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog's `filter_by_level`, asked of the standard library's `isEnabledFor`, which
    caches its answer per logger (`getEffectiveLevel` walks the logger's parents per call)
    and also honours `logging.disable`."""
    if logger.isEnabledFor(_LEVEL_NUMBERS[method_name]):
        return event
    raise structlog.DropEvent


class Stamp:
    """The level, the logger's name and the time, as structlog's `add_log_level`,
    `add_logger_name` and `TimeStamper(fmt="iso", utc=True)` write them, in one step.

    The time's text up to the second is kept from the line before (a `datetime` formatted
    per line cost 1.8 µs, this 0.7 µs); kept as one tuple, so that a thread writing at the
    same moment never pairs one second's text with another's."""

    def __init__(self) -> None:
        self._second_text: tuple[int, str] = (-1, "")

    def timestamp(self) -> str:
        second, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
        kept_second, text = self._second_text
        if second != kept_second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second_text = (second, text)
        return f"{text}.{nanoseconds // 1000:06d}Z"

    def __call__(self, logger: Any, method_name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event["level"] = _LEVEL_ALIASES.get(method_name, method_name)
        record = event.get("_record")
        event["logger"] = record.name if record is not None else logger.name
        event["timestamp"] = self.timestamp()
        return event


def _shared_processors() -> list[Any]:
    return [log_context.merge_fields, Stamp(), scrub]


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
        rest = _console_fields(event)
        shown_level = f"{level:<8}"
        if self._colours and level in _LEVEL_COLOURS:
            shown_level = f"{_LEVEL_COLOURS[level]}{shown_level}\x1b[0m"
        line = " ".join(part for part in (shown_level, message, " ".join(lead)) if part)
        if rest:
            line = f"{line}  {rest}"
        return "\n".join([line, *below])


# Values whose text is their repr and never holds a space: written as they are.
_BARE = frozenset({int, float, bool, type(None)})


def _console_fields(event: MutableMapping[str, Any]) -> str:
    """`key=value ...`: text as it is, anything else as its repr; quoted (repr again) when
    that is empty or holds a space."""
    return " ".join([
        f"{key}={value}" if (kind := type(value)) in _BARE or (kind is str and value and " " not in value)
        else f"{key}={_console_value(value)}"
        for key, value in event.items()
    ])


def _console_value(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if text and " " not in text else repr(text)


def _unserialisable(value: Any) -> str:
    return repr(value)


# The standard library's encoder, for a line that is not ASCII and for what orjson refuses
# (a lone surrogate nested in a field, an integer wider than 64 bits), in orjson's compact
# shape; one for every such line, not one per call.
_encode_json = jsonlib.JSONEncoder(default=_unserialisable, separators=(",", ":")).encode


# A dataclass goes through `repr` as with the standard library, never field by field:
# its `repr=False` fields (a secret's) stay out of the line.
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS


def render_json(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
    """One JSON object, ASCII only (the text a line carries is escaped, never raw bytes).

    orjson writes a request's line in a sixth of the standard library's time (0.8 µs
    against 4.9 µs); a line holding anything but ASCII, or anything orjson refuses, is
    written by the standard library's encoder, escaped as it always was."""
    try:
        line = orjson.dumps(event, default=_unserialisable, option=_ORJSON_OPTIONS)
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
        return _encode_json(event)
    if line.isascii():
        return line.decode("ascii")
    return _encode_json(event)


# A structlog event's record: its file is never looked up (no line shows it), and it is
# marked finished (context merged, stamped, scrubbed) for `LineFormatter`. The mark's
# leading underscore keeps it out of what Sentry's logging integration reports as extras.
_NO_SOURCE = "(unknown file)"
_FINISHED_EVENT = "_finished_event"


class EventWriter:
    """The logger at the end of the structlog chain: one record per event, handed to the
    standard-library logger of the same name, its handlers and filters. The record is the
    standard library's own (`Logger.makeRecord`, so a record factory installed by a tracing
    library applies), with the event's finished dict as `msg`: handlers, pytest's `caplog`
    and Sentry's logging integration see an ordinary record, with every attribute of the
    running Python's `LogRecord` (`taskName` from 3.12).

    structlog's `stdlib.LoggerFactory` goes through `Logger._log`, which walks the stack
    for the caller's file and line (no line of ours shows them), and `ProcessorFormatter`
    then copies the record; a request's line paid for both."""

    __slots__ = ("_logger", "name")

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self.name = logger.name

    def isEnabledFor(self, level: int) -> bool:  # the stdlib's name
        return self._logger.isEnabledFor(level)

    def _write(self, level: int, event: dict[str, Any]) -> None:
        logger = self._logger
        record = logger.makeRecord(self.name, level, _NO_SOURCE, 0, event, (), None)
        setattr(record, _FINISHED_EVENT, True)  # not through `extra`: its checks cost 3k instructions a line
        logger.handle(record)

    def debug(self, event: dict[str, Any]) -> None:
        self._write(logging.DEBUG, event)

    def info(self, event: dict[str, Any]) -> None:
        self._write(logging.INFO, event)

    def warning(self, event: dict[str, Any]) -> None:
        self._write(logging.WARNING, event)

    def error(self, event: dict[str, Any]) -> None:
        self._write(logging.ERROR, event)

    def critical(self, event: dict[str, Any]) -> None:
        self._write(logging.CRITICAL, event)


def write_events(*names: Any) -> EventWriter:
    """structlog's logger factory: `structlog.get_logger(name)` writes through the
    standard-library logger `name`."""
    return EventWriter(logging.getLogger(names[0] if names else None))


def hand_to_writer(_: Any, __: str, event: MutableMapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The chain's last step: the event dict as the writer's one argument (a dict returned
    as it is would be spread into keyword arguments, a copy)."""
    return (event,), {}


_STACK_INFO = structlog.processors.StackInfoRenderer()


class LineFormatter(logging.Formatter):
    """The formatter of every line. A structlog event (a record marked `_FINISHED_EVENT`)
    arrives finished and is only rendered; any other record (aiohttp, asyncio, gunicorn,
    asyncpg) goes through structlog's `ProcessorFormatter` with the same steps first, so
    every line has one shape."""

    def __init__(self, render: Any) -> None:
        super().__init__()
        self._render = render
        self._foreign = structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared_processors(),
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.StackInfoRenderer(),
                structlog.processors.format_exc_info,
                render,
            ],
        )

    def format(self, record: logging.LogRecord) -> str:
        if not getattr(record, _FINISHED_EVENT, False):
            return self._foreign.format(record)
        # A copy: the renderers take fields out, and a handler after this one (caplog)
        # reads the event as it was logged.
        event: MutableMapping[str, Any] = dict(record.msg)  # type: ignore[arg-type]  # a finished event's msg is its dict
        if "exc_info" in event or "stack_info" in event:
            event = _STACK_INFO(None, "", event)
            event = structlog.processors.format_exc_info(None, "", event)
        return self._render(None, "", event)


def event_chain() -> list[Any]:
    """A structlog event's processors, in order."""
    return [drop_below_level, *_shared_processors(), hand_to_writer]


def stdlib_formatter(json: bool = False, colours: bool = False) -> logging.Formatter:
    """The formatter of every line, for the standard-library handler. gunicorn's master
    builds it from `logconfig_dict` (config/gunicorn.conf.py); the entry points through
    `configure_logging`."""
    return LineFormatter(render_json if json else ConsoleLine(colours=colours))


def configure_logging(*, level: str = "INFO", json: bool = False) -> None:
    """Process-wide logging setup; called by the entry points, never by `create_app`."""
    structlog.configure(
        # A line below the level is dropped first, before the context is merged and the
        # event redacted: stdlib logging would drop it only after all of that (at
        # LOG_LEVEL=warning that was every request's canonical line, per request). The
        # filtering wrapper drops it before even building the event (its methods below the
        # level do nothing: 6 µs per call saved against raising DropEvent from
        # `drop_below_level`, which stays for loggers set above the root level).
        processors=event_chain(),
        logger_factory=write_events,
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
    logger: str = "mlpa_aiohttp.process.startup",
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
                "timestamp": Stamp().timestamp(),
            }
        )
        text = render_json(None, "", record)
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
