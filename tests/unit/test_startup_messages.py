"""Settings report every problem at once; the console line leads with what a person scans."""

from __future__ import annotations

import io
import json
import logging

import pytest

from mlpa_aiohttp.observability.logging import ConsoleLine, log_startup_failure, stdlib_formatter
from mlpa_aiohttp.settings import Settings, SettingsError

from ..conftest import TEST_SECRETS


def test_every_invalid_variable_is_listed_in_one_error() -> None:
    environ = {
        **TEST_SECRETS,
        "PORT": "eighty",
        "LOG_LEVEL": "loud",
        "TOP_P": "nan",
        "MLPA_CAPPED_SERVICE_TYPES": "ai,nope",
        "DB_PORT": "0",
    }
    with pytest.raises(SettingsError) as raised:
        Settings.from_environ(environ)
    named = [problem.split(":", 1)[0] for problem in raised.value.problems]
    assert named == ["PORT", "LOG_LEVEL", "TOP_P", "MLPA_CAPPED_SERVICE_TYPES", "DB_PORT"]
    assert str(raised.value) == "; ".join(raised.value.problems)


def test_every_secret_rule_is_reported_together(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # Not a Google Cloud machine, whatever runs the test (the Play check would find one).
    monkeypatch.setattr("mlpa_aiohttp.settings._GCE_PRODUCT_NAME_FILE", str(tmp_path / "no-dmi"))
    environ = {
        "MASTER_KEY": "sk-default",
        "MLPA_VIRTUAL_KEY": "",
        "MLPA_ACCESS_TOKEN_SECRET": "x" * 31,
        "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": "",  # empty is how production turns dev tiers off
    }
    with pytest.raises(SettingsError) as raised:
        Settings.from_environ(environ)
    problems = {problem.split(":", 1)[0]: problem for problem in raised.value.problems}
    # With the secrets, in the same message, what iOS and Android clients would miss (D63).
    assert set(problems) == {
        "MASTER_KEY", "MLPA_VIRTUAL_KEY", "MLPA_UI_ACCESS_KEY", "MLPA_ACCESS_TOKEN_SECRET",
        "APP_DEVELOPMENT_TEAM", "APP_ATTEST_BUNDLE_IDS", "PLAY_INTEGRITY_CREDENTIALS_FILE",
    }
    assert "still the documented default" in problems["MASTER_KEY"]
    assert "empty" in problems["MLPA_VIRTUAL_KEY"]
    assert "not set" in problems["MLPA_UI_ACCESS_KEY"]
    assert "at least 32 bytes" in problems["MLPA_ACCESS_TOKEN_SECRET"] and "got 31" in problems["MLPA_ACCESS_TOKEN_SECRET"]
    assert "x" * 31 not in str(raised.value)
    Settings.from_environ({**environ, **TEST_SECRETS, "MLPA_ACCESS_TOKEN_SECRET": "é" * 16})  # 32 bytes in UTF-8


def test_console_line_leads_with_level_event_method_path_status_duration() -> None:
    record = logging.LogRecord("mlpa_aiohttp.request", logging.INFO, __file__, 1, "", None, None)
    event = {
        "event": "request",
        "user_agent": "curl/8",
        "request_id": "abc",
        "status": 200,
        "duration_ms": 12.5,
        "path": "/v1/chat/completions",
        "method": "POST",
        "purpose": "-",
        "level": "info",
    }
    line = ConsoleLine()(None, "info", dict(event))
    assert line.startswith("INFO     request POST /v1/chat/completions 200 12.5ms  ")
    assert line.endswith("user_agent=curl/8 request_id=abc purpose=-")
    # Through the formatter a stdlib record gets the same shape.
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(stdlib_formatter(json=False))
    logger = logging.getLogger("test.console")
    logger.addHandler(handler)
    try:
        logger.warning("Worker exiting (pid: %s)", 7)
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().startswith("WARNING  Worker exiting (pid: 7)  logger=test.console timestamp=")


def test_a_single_startup_problem_is_one_console_line() -> None:
    stream = io.StringIO()
    log_startup_failure("configuration_error", ["PORT: expected an integer, got 'x'"], exit_code=78, hint="see README", json=False, stream=stream)
    assert stream.getvalue() == "CRITICAL configuration_error: PORT: expected an integer, got 'x' (exit status 78; see README)\n"


@pytest.mark.parametrize("as_json", [True, False])
def test_startup_failure_is_one_message(as_json: bool) -> None:
    stream = io.StringIO()
    log_startup_failure(
        "configuration_error", ["PORT: expected an integer, got 'x'", "MASTER_KEY: not set"],
        exit_code=78, hint="see README", json=as_json, stream=stream,
    )
    text = stream.getvalue()
    if as_json:
        (line,) = text.splitlines()
        record = json.loads(line)
        assert record["event"] == "configuration_error" and record["exit_code"] == 78
        assert record["problems"] == ["PORT: expected an integer, got 'x'", "MASTER_KEY: not set"]
    else:
        assert text.splitlines() == [
            "CRITICAL configuration_error: 2 problems, exit status 78",
            "  - PORT: expected an integer, got 'x'",
            "  - MASTER_KEY: not set",
            "  see README",
        ]
