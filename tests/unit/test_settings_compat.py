"""The reference's variable names at switch-over: renamed ones are aliases with a warning,
retired ones and unknown MLPA_/UPSTREAM_/PG_ names are warned about (settings/compat.py)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from mlpa_aiohttp.settings import Settings, variable_names
from mlpa_aiohttp.settings.compat import NOT_READ, RENAMED, environment_notices, unknown_variable_notes
from mlpa_aiohttp.process.startup import EXIT_CONFIG, EXIT_UNAVAILABLE

from ..conftest import TEST_SECRETS


def notices_for(environ: dict[str, str]) -> dict[str, tuple[str, dict[str, str]]]:
    return {n.fields["variable"]: (n.event, dict(n.fields)) for n in environment_notices(environ, variable_names())}


def test_every_rename_targets_a_variable_that_is_read() -> None:
    known = variable_names()
    assert {rename.new for rename in RENAMED.values()} <= known
    assert not (set(RENAMED) | set(NOT_READ)) & known


@pytest.mark.parametrize(
    "old,value,read",
    [
        ("LOGURU_LEVEL", "debug", lambda s: s.server.log_level == "DEBUG"),
        ("HTTPX_CONNECT_TIMEOUT_SECONDS", "30", lambda s: s.upstream.connect_timeout_seconds == 30.0),
        ("HTTPX_READ_TIMEOUT_SECONDS", "30", lambda s: s.upstream.read_timeout_seconds == 30.0),
        ("HTTPX_MAX_CONNECTIONS", "200", lambda s: s.upstream.max_connections == 200),
        ("HTTPX_KEEPALIVE_EXPIRY_SECONDS", "15", lambda s: s.upstream.keepalive_timeout_seconds == 15.0),
    ],
)
def test_renamed_variables_are_read_as_their_new_names(old: str, value: str, read) -> None:
    defaults = Settings.from_environ(TEST_SECRETS)
    assert not read(defaults), "the old value must differ from the new default for this test to mean anything"
    assert read(Settings.from_environ({**TEST_SECRETS, old: value}))
    # Names are case-insensitive, as in the reference.
    assert read(Settings.from_environ({**TEST_SECRETS, old.lower(): value}))


def test_the_new_name_wins_when_both_are_set() -> None:
    settings = Settings.from_environ({**TEST_SECRETS, "LOGURU_LEVEL": "debug", "LOG_LEVEL": "error"})
    assert settings.server.log_level == "ERROR"
    event, fields = notices_for({"LOGURU_LEVEL": "debug", "LOG_LEVEL": "error"})["LOGURU_LEVEL"]
    assert event == "setting_renamed" and fields["ignored_because"] == "LOG_LEVEL is set"


def test_renamed_notice_names_the_new_variable_and_its_default() -> None:
    found = notices_for({"HTTPX_CONNECT_TIMEOUT_SECONDS": "30", "LOGURU_LEVEL": "INFO"})
    assert found["HTTPX_CONNECT_TIMEOUT_SECONDS"] == (
        "setting_renamed",
        {
            "variable": "HTTPX_CONNECT_TIMEOUT_SECONDS",
            "use": "UPSTREAM_CONNECT_TIMEOUT_SECONDS",
            "read_as": "UPSTREAM_CONNECT_TIMEOUT_SECONDS",
            "new_default": "10",
            "reference_default": "30",
        },
    )
    # Same default (case aside): no default in the notice.
    assert found["LOGURU_LEVEL"][1] == {"variable": "LOGURU_LEVEL", "use": "LOG_LEVEL", "read_as": "LOG_LEVEL"}


@pytest.mark.parametrize(
    "typo,closest",
    [
        ("MLPA_MAX_SIGNED_IN_USER", "MLPA_MAX_SIGNED_IN_USERS"),
        ("MLPA_ENFORCE_SIGNUP_CAP", "MLPA_ENFORCE_SIGNIN_CAP"),
        ("UPSTREAM_CONECT_TIMEOUT_SECONDS", "UPSTREAM_CONNECT_TIMEOUT_SECONDS"),
        ("PG_STATEMENT_TIMEOUT", "PG_STATEMENT_TIMEOUT_MS"),
    ],
)
def test_unknown_variables_name_the_closest_known_one(typo: str, closest: str) -> None:
    assert notices_for({typo: "1"})[typo] == ("setting_unknown", {"variable": typo, "did_you_mean": closest})


def test_known_and_foreign_variables_get_no_notice() -> None:
    environ = {"MLPA_MAX_SIGNED_IN_USERS": "5", "PG_POOL_MAX_SIZE": "3", "HOME": "/root", "PGHOST": "db", "KUBERNETES_PORT": "x"}
    assert notices_for(environ) == {}


def test_retired_variables_say_why() -> None:
    event, fields = notices_for({"DISCONNECT_POLL_INTERVAL_SECONDS": "0.1"})["DISCONNECT_POLL_INTERVAL_SECONDS"]
    assert event == "setting_not_read" and "event-driven" in fields["reason"]


def test_the_reference_fxa_client_credentials_are_retired_without_breaking_a_start() -> None:
    """The reference read CLIENT_ID/CLIENT_SECRET and never used them: a configuration that
    still sets them starts as without them, and each gets a reason, not a misspelling note."""
    credentials = {"CLIENT_ID": "reference-client-id", "CLIENT_SECRET": "reference-client-secret"}
    assert not set(credentials) & variable_names()
    assert Settings.from_environ({**TEST_SECRETS, **credentials}) == Settings.from_environ(TEST_SECRETS)
    found = notices_for(credentials)
    assert {name: event for name, (event, _fields) in found.items()} == dict.fromkeys(credentials, "setting_not_read")
    assert all("without client credentials" in fields["reason"] for _event, fields in found.values())
    assert unknown_variable_notes({**TEST_SECRETS, **credentials}, variable_names()) == []


def test_a_real_start_logs_each_notice_once_and_never_a_value() -> None:
    """`migrate` against a closed port: it reads the settings, logs, then fails to connect."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    environ = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.getcwd(),
        "LOG_JSON": "true",
        "LOGURU_LEVEL": "warning",
        "HTTPX_MAX_CONNECTIONS": "200",
        "MLPA_MAX_SIGNED_IN_USER": "secret-looking-value-42",
        "CLIENT_SECRET": "reference-fxa-client-secret-7",
        "DB_HOST": "127.0.0.1",
        "DB_PORT": str(closed_port),
    }
    done = subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "migrate"], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    warnings = [(line["event"], line["variable"]) for line in lines if line.get("level") == "warning"]
    assert sorted(warnings) == [
        ("setting_not_read", "CLIENT_SECRET"),
        ("setting_renamed", "HTTPX_MAX_CONNECTIONS"),
        ("setting_renamed", "LOGURU_LEVEL"),
        ("setting_unknown", "MLPA_MAX_SIGNED_IN_USER"),
    ]
    assert "secret-looking-value-42" not in done.stdout + done.stderr
    assert "reference-fxa-client-secret-7" not in done.stdout + done.stderr
    # LOGURU_LEVEL=warning took effect: no INFO line.
    assert not [line for line in lines if line.get("level") == "info"]


def test_a_short_access_token_secret_stops_start_up_with_a_clear_message() -> None:
    """The reference accepted secrets under 32 bytes; a deployment carrying one over learns
    at start-up what to do and what a new secret costs, and the secret is not printed."""
    short = "sixteen-byte-key"
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": os.getcwd(), **TEST_SECRETS, "MLPA_ACCESS_TOKEN_SECRET": short}
    done = subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "serve"], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EXIT_CONFIG
    message = done.stderr.strip()
    assert message.startswith("CRITICAL configuration_error: MLPA_ACCESS_TOKEN_SECRET: must be at least 32 bytes for HS256, got 16")
    assert "invalidates every outstanding access token" in message and "docs/migration.md" in message
    assert short not in done.stdout + done.stderr


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_the_new_default_in_a_notice_is_the_settings_default(old: str) -> None:
    """The notice quotes the new variable's default; setting the variable to it changes nothing."""
    rename = RENAMED[old]
    quoted = re.search(r"\(([^)]*)\)", rename.new_default)  # "STREAMING_TIMEOUT_SECONDS (300)"
    value = quoted.group(1) if quoted else rename.new_default
    debug = {"MLPA_DEBUG": "true"}
    assert Settings.from_environ({**debug, rename.new: value}) == Settings.from_environ(debug)
