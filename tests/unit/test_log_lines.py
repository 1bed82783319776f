"""What a line holds: structlog events and the standard library's records through one
formatter, tracebacks included, and `scrub` held to the plain two-pass rule it replaced."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import re
import sys
import threading
from typing import Any, Iterator

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpa_aiohttp.observability import log_context
from mlpa_aiohttp.observability.logging import (
    REDACTED, REDACTED_KEYS, _redact, render_json, scrub, stdlib_formatter,
)
from mlpa_aiohttp.wire import loggable
from tests.support.depth import examples

from ..conftest import Service, chat_body

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class Lines:
    def __init__(self, name: str) -> None:
        self.stream = io.StringIO()
        self.records: list[logging.LogRecord] = []
        self.name = name

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines() if line.startswith("{")]


class _Keep(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__()
        self._into = into

    def emit(self, record: logging.LogRecord) -> None:
        self._into.append(record)


@pytest.fixture
def lines(request: pytest.FixtureRequest) -> Iterator[Lines]:
    """A JSON handler on a logger of the test's own, and a second handler after it that
    keeps the records, as pytest's caplog does."""
    found = Lines(f"tests.log_lines.{request.node.name}")
    writer = logging.StreamHandler(found.stream)
    writer.setFormatter(stdlib_formatter(json=True))
    keeper = _Keep(found.records)
    logger = logging.getLogger(found.name)
    logger.addHandler(writer)
    logger.addHandler(keeper)
    logger.propagate = False
    try:
        yield found
    finally:
        logger.removeHandler(writer)
        logger.removeHandler(keeper)


def test_a_structlog_event_is_one_json_line_with_its_context_level_logger_and_time(lines: Lines) -> None:
    log_context.begin(request_id="r-1", route="/v1/chat/completions")
    try:
        log_context.bind(model="gpt-oss-120b", status=0)
        structlog.get_logger(lines.name).info("request", status=200, duration_ms=12.5)
    finally:
        log_context.begin()  # this test runs in the session's own context

    [line] = lines.json()
    assert line["event"] == "request"
    assert line["status"] == 200  # the event's own field wins over the context's
    assert (line["request_id"], line["route"], line["model"]) == ("r-1", "/v1/chat/completions", "gpt-oss-120b")
    assert (line["level"], line["logger"]) == ("info", lines.name)
    assert ISO_UTC.match(line["timestamp"]), line["timestamp"]
    [record] = lines.records
    assert record.levelno == logging.INFO and record.name == lines.name
    assert record.msg["event"] == "request"  # type: ignore[index]


def test_an_exception_logged_through_structlog_carries_its_traceback_and_leaves_the_record_whole(
    lines: Lines,
) -> None:
    log = structlog.get_logger(lines.name)
    try:
        raise ValueError("the probe failed")
    except ValueError:
        log.exception("probe_failed", step="parse")

    [line] = lines.json()
    assert line["level"] == "error" and line["step"] == "parse"
    assert "Traceback (most recent call last)" in line["exception"]
    assert "ValueError: the probe failed" in line["exception"]
    # The handler after the writer still sees the event as it was logged.
    [record] = lines.records
    assert record.msg["exc_info"] is True  # type: ignore[index]


def test_a_standard_library_record_gets_the_same_shape_and_its_traceback(lines: Lines) -> None:
    logger = logging.getLogger(lines.name)
    try:
        {}["missing"]
    except KeyError:
        logger.error("lookup failed for %s", "missing", exc_info=True)

    [line] = lines.json()
    assert line["event"] == "lookup failed for missing"
    assert (line["level"], line["logger"]) == ("error", lines.name)
    assert ISO_UTC.match(line["timestamp"])
    assert "KeyError: 'missing'" in line["exception"]


def test_a_logger_set_above_the_root_level_drops_structlog_events(lines: Lines) -> None:
    logger = logging.getLogger(lines.name)
    logger.setLevel(logging.ERROR)
    try:
        structlog.get_logger(lines.name).warning("below_this_loggers_level")
        structlog.get_logger(lines.name).error("at_this_loggers_level")
    finally:
        logger.setLevel(logging.NOTSET)
    assert [line["event"] for line in lines.json()] == ["at_this_loggers_level"]


def test_secret_names_in_any_case_are_hidden_at_the_top_level(lines: Lines) -> None:
    # U+212A KELVIN SIGN lowercases to an ASCII "k": "MASTER_\u212aEY" is master_key.
    structlog.get_logger(lines.name).warning(
        "probe", Authorization="Bearer s3cret", **{"MASTER_\u212aEY": "sk-s3cret"}, kept="visible"
    )
    [line] = lines.json()
    assert "s3cret" not in lines.stream.getvalue()
    assert line["Authorization"] == REDACTED and line["MASTER_\u212aEY"] == REDACTED
    assert line["kept"] == "visible"


# --- scrub against the rule it replaced ---------------------------------------------------


def scrubbed_plainly(event: dict[str, Any]) -> dict[str, Any]:
    """The two passes `scrub` replaced (redact every name, then escape every text value),
    written as plainly as the rule reads."""
    out = {}
    for key, value in event.items():
        if key.lower() in REDACTED_KEYS:
            out[key] = REDACTED
        elif isinstance(value, (dict, list, tuple)):
            out[key] = _redact(value, 1)
        else:
            out[key] = value
    return {key: loggable(value) if type(value) is str else value for key, value in out.items()}


def _case_variants(name: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda upper: "".join(c.upper() if flip else c for c, flip in zip(name, upper))
    )


_redacted_names = st.sampled_from(sorted(REDACTED_KEYS)).flatmap(_case_variants)
_names = st.one_of(
    _redacted_names,
    _redacted_names.map(lambda name: name.replace("k", "\u212a").replace("K", "\u212a")),
    st.text(min_size=1, max_size=12),
    st.sampled_from(["request_id", "user_agent", "model", "status", "tool_names", "event"]),
)
_text = st.one_of(st.text(max_size=20), st.sampled_from(["curl/8", "a\x1bb", "\udcff", "tab\there", "\u00a0"]))
_leaves = st.one_of(_text, st.integers(), st.floats(allow_nan=False), st.booleans(), st.none())
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_names, inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=examples(400), deadline=None)
@given(st.dictionaries(_names, _values, max_size=30))
def test_scrub_hides_and_escapes_exactly_what_the_plain_rule_does(event: dict[str, Any]) -> None:
    expected = scrubbed_plainly(dict(event))
    got = scrub(None, "info", dict(event))
    assert list(got) == list(expected)
    assert repr(got) == repr(expected)  # repr: floats and nested containers compared as written


# --- the JSON line: orjson's, or the standard library's when orjson cannot -----------------

_finite_leaves = st.one_of(_text, st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                           st.none())
_json_values = st.recursive(
    _finite_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=examples(400), deadline=None)
@given(st.dictionaries(st.text(max_size=12), _json_values, max_size=12))
def test_a_json_line_is_ascii_and_reads_back_as_the_standard_librarys_would(event: dict[str, Any]) -> None:
    line = render_json(None, "info", event)
    assert line.isascii() and "\n" not in line
    assert json.loads(line) == json.loads(json.dumps(event, default=repr))


def test_a_json_line_has_one_shape_whichever_encoder_wrote_it() -> None:
    ascii_only = render_json(None, "info", {"event": "request", "status": 200})
    with_umlaut = render_json(None, "info", {"event": "request", "user_agent": "Zürich/1"})
    assert ascii_only == '{"event":"request","status":200}'
    assert with_umlaut == '{"event":"request","user_agent":"Z\\u00fcrich/1"}'
    assert render_json(None, "info", {"too_wide": 2**70}) == '{"too_wide":%d}' % 2**70


def test_a_dataclass_in_a_json_line_is_its_repr_so_its_hidden_fields_stay_hidden() -> None:
    @dataclasses.dataclass
    class Credentials:
        user: str
        secret: str = dataclasses.field(repr=False)

    line = json.loads(render_json(None, "info", {"event": "probe", "who": Credentials("u-1", "s3cret")}))
    assert "s3cret" not in line["who"] and "u-1" in line["who"]


# Every attribute the standard library documents for a format string ("LogRecord
# attributes"), as the running Python has them.
DOCUMENTED_ATTRIBUTES = [
    "args", "asctime", "created", "exc_info", "filename", "funcName", "levelname", "levelno", "lineno",
    "message", "module", "msecs", "msg", "name", "pathname", "process", "processName", "relativeCreated",
    "stack_info", "thread", "threadName",
] + (["taskName"] if sys.version_info >= (3, 12) else [])
EVERY_ATTRIBUTE = "\x1f".join(f"{name}=%({name})s" for name in DOCUMENTED_ATTRIBUTES)


def formatted_fields(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, str]:
    return dict(field.split("=", 1) for field in formatter.format(record).split("\x1f"))


async def test_a_standard_format_with_every_documented_attribute_formats_the_services_lines(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's own handler (a file, syslog, a collector's agent) may format any
    attribute the running Python documents, `taskName` on 3.12 and later included."""
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    await response.read()

    formatter = logging.Formatter(EVERY_ATTRIBUTE)
    [record] = [r for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "request"]
    fields = formatted_fields(formatter, record)
    assert list(fields) == DOCUMENTED_ATTRIBUTES
    assert (fields["name"], fields["levelname"], fields["levelno"]) == ("mlpa_aiohttp.request", "INFO", "20")
    assert fields["process"] == str(os.getpid()) and fields["threadName"] == threading.current_thread().name
    assert "'event': 'request'" in fields["message"] and "'status': 200" in fields["message"]
    if sys.version_info >= (3, 12):
        # Written by the request's handler, in a task of aiohttp's.
        assert fields["taskName"] not in ("", "None")
    # And every other line the request wrote.
    for other in caplog.records:
        assert list(formatted_fields(formatter, other)) == DOCUMENTED_ATTRIBUTES


async def test_a_record_factory_applies_to_the_services_lines(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """A tracing library's logging integration installs a record factory to put its ids on
    every record; the service's own lines are made by it too."""
    standard_factory = logging.getLogRecordFactory()

    def with_trace_id(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = standard_factory(*args, **kwargs)
        record.trace_id = "trace-1"  # type: ignore[attr-defined]
        return record

    logging.setLogRecordFactory(with_trace_id)
    try:
        response = await service.client.get("/health/liveness")
        assert response.status == 200
        await response.read()
    finally:
        logging.setLogRecordFactory(standard_factory)

    [record] = [r for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "request"]
    assert record.trace_id == "trace-1"  # type: ignore[attr-defined]
