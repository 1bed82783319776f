"""One redaction list, every sink (compatibility.md D17): each name of
`observability/redaction.py` goes through a JSON log line, a Sentry event sent by the real
SDK to a loopback fake, and the scrubber of LiteLLM's error text; its value appears in none.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import zlib
from typing import Any, AsyncIterator, Iterator

import pytest
import sentry_sdk
import structlog

from mlpa_aiohttp import __version__
from mlpa_aiohttp.observability.logging import stdlib_formatter
from mlpa_aiohttp.observability.redaction import (
    CONTENT_FIELDS,
    CREDENTIAL_FIELDS,
    NEVER_LOGGED,
    SENSITIVE_FIELDS,
)
from mlpa_aiohttp.observability.sentry import init_sentry
from mlpa_aiohttp.observability.upstream_text import upstream_text_for_log
from tests.support.fake_sentry import FakeSentry

NAMES = sorted(NEVER_LOGGED)
KEPT = "gpt-oss-120b"


def private_value(name: str) -> str:
    # Short enough that the upstream scrubber's long-quote rule alone would not hide it.
    return f"pv-{zlib.crc32(name.encode()):010d}"


def test_the_list_is_the_union_each_sink_used_to_keep_on_its_own() -> None:
    # What the three sinks hid before they shared the list, so none hides less now.
    previously_logs = {"messages", "tools", "authorization", "x-dev-authorization", "master_key", "master-key",
                       "mlpa_ui_access_key", "mlpa-ui-access-key", "password", "cookie", "query"}
    previously_sentry = {"messages", "tools", "query", "input", "prompt", "authorization", "proxy-authorization",
                         "x-dev-authorization", "master_key", "master-key", "mlpa_ui_access_key",
                         "mlpa-ui-access-key", "cookie", "set-cookie"}
    previously_upstream = {"content", "input", "messages", "message_content", "text", "query", "prompt",
                           "arguments", "tools", "tool_calls", "system", "instructions", "user_input", "body", "data"}
    # One exception: `tool_calls` is the request line's count; the calls' content is `arguments`.
    assert previously_logs | (previously_upstream - {"tool_calls"}) <= NEVER_LOGGED
    assert previously_sentry <= SENSITIVE_FIELDS
    assert SENSITIVE_FIELDS == CONTENT_FIELDS | CREDENTIAL_FIELDS
    assert all(name == name.lower() for name in NEVER_LOGGED)
    assert "tool_calls" not in NEVER_LOGGED


# --- logs: a structlog event rendered as the production JSON line ---------------------------


@pytest.fixture
def json_log_lines() -> Iterator[tuple[Any, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(stdlib_formatter(json=True))
    stdlib_logger = logging.getLogger("tests.redaction")
    stdlib_logger.addHandler(handler)
    try:
        yield structlog.get_logger("tests.redaction"), stream
    finally:
        stdlib_logger.removeHandler(handler)


@pytest.mark.parametrize("name", NAMES)
def test_log_line_never_carries_the_value(json_log_lines: tuple[Any, io.StringIO], name: str) -> None:
    log, stream = json_log_lines
    value = private_value(name)
    log.warning(
        "redaction_probe",
        model=KEPT,
        **{name: value},
        nested={"outer": {name.upper(): value}},
        listed=[{name: value}],
    )
    [line] = stream.getvalue().splitlines()
    assert value not in line
    event = json.loads(line)
    assert event["model"] == KEPT
    assert event[name] == "[redacted]"
    assert event["nested"]["outer"][name.upper()] == "[redacted]"


# --- Sentry: the real SDK, before_send / before_breadcrumb, a loopback fake ----------------


@pytest.fixture
async def fake_sentry(aiohttp_server: Any) -> AsyncIterator[FakeSentry]:
    fake = FakeSentry()
    server = await aiohttp_server(fake.make_app())
    assert init_sentry(fake.dsn(server.port), release=__version__, environment="test")
    yield fake
    sentry_sdk.flush(timeout=2)
    sentry_sdk.init(dsn=None)


async def test_sentry_event_never_carries_the_values(fake_sentry: FakeSentry) -> None:
    for name in NAMES:
        value = private_value(name)
        sentry_sdk.add_breadcrumb(category="http", message="probe", data={name: value, "model": KEPT})
        sentry_sdk.capture_event(
            {
                "message": f"redaction probe {name}",
                "level": "error",
                "request": {
                    "url": "http://127.0.0.1/v1/chat/completions",
                    "method": "POST",
                    "headers": {name: value, name.title(): value},
                    "data": {name: value, "model": KEPT},
                },
                "extra": {name: value, "nested": {"outer": [{name.upper(): value}]}, "model": KEPT},
            }
        )
        await asyncio.to_thread(sentry_sdk.flush, 5)
    events = fake_sentry.events
    assert len(events) == len(NAMES)
    for name, event in zip(NAMES, events):
        text = json.dumps(event)
        assert name in event["message"]
        assert private_value(name) not in text, name
        assert event["extra"]["model"] == KEPT
        assert any(crumb.get("data", {}).get("model") == KEPT for crumb in event["breadcrumbs"]["values"])


# --- LiteLLM's error text, as it is logged --------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "shape",
    [
        '{{"error": {{"message": "bad request", "{name}": "{value}", "model": "{kept}"}}}}',
        "litellm.BadRequestError: {{'{name}': '{value}', 'model': '{kept}'}}",
        '{{"error": "invalid", "model": "{kept}", "{name}": [{{"role": "user", "x": "{value}"}}]}}',
        "pydantic error: {name}={value!r} model={kept}",
    ],
    ids=["json", "python-literal", "structured", "keyword"],
)
def test_upstream_error_text_never_carries_the_value(name: str, shape: str) -> None:
    value = private_value(name)
    text = shape.format(name=name, value=value, kept=KEPT)
    assert value in text
    logged = upstream_text_for_log(text)
    assert value not in logged
    assert KEPT in logged
