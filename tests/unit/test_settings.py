"""Settings: names carried over from the reference, clear failures, refused default secrets."""

from __future__ import annotations

import dataclasses

import pytest

from mlpa_aiohttp.catalog import ServiceType
from mlpa_aiohttp.settings import (
    DEBUG_DEFAULTS,
    DEFAULT_SECRETS,
    DEMO_DEFAULTS,
    FXA_PRODUCTION_URL,
    FXA_STAGE_URL,
    FxASettings,
    PostgresSettings,
    ServerSettings,
    Settings,
    SettingsError,
    variable_names,
)

from ..conftest import TEST_KEYS, TEST_SECRETS


def test_defaults_and_overrides() -> None:
    settings = Settings.from_environ(
        {
            **TEST_SECRETS,
            "PORT": "9000",
            "TEMPERATURE": "0.5",
            "MLPA_CAPPED_SERVICE_TYPES": '["ai"]',
            "USER_FEATURE_BUDGET_AGENT_MAX_BUDGET": "2.5",
            "ADDITIONAL_FXA_SCOPE_2": "https://identity.mozilla.com/apps/smartwindow",
        }
    )
    assert settings.server.port == 9000
    assert settings.completion.temperature == 0.5
    assert settings.signup_cap.capped_service_types == frozenset({ServiceType.AI})
    assert settings.budgets[ServiceType.AGENT].max_budget == 2.5
    assert settings.budgets[ServiceType.AGENT].budget_duration == "7d"
    assert settings.fxa.scopes == ("profile:uid", "https://identity.mozilla.com/apps/smartwindow")
    assert settings.fxa.base_url == FXA_PRODUCTION_URL
    # compatibility.md D4: the non-streaming timeout follows the streaming one by default.
    assert settings.upstream.read_timeout_seconds == settings.upstream.streaming_timeout_seconds == 300


def test_debug_selects_stage_fxa() -> None:
    assert Settings.from_environ({"MLPA_DEBUG": "yes"}).fxa.base_url == FXA_STAGE_URL


@pytest.mark.parametrize(
    "name,value",
    [("PORT", "eighty"), ("MLPA_DEBUG", "maybe"), ("TOP_P", "nan"), ("MLPA_STORE", "redis"), ("MLPA_CAPPED_SERVICE_TYPES", "ai,nope")],
)
def test_invalid_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_environ({**TEST_SECRETS, name: value})


@pytest.mark.parametrize("name", ["MASTER_KEY", "MLPA_VIRTUAL_KEY", "MLPA_UI_ACCESS_KEY", "MLPA_ACCESS_TOKEN_SECRET"])
def test_default_secrets_are_refused_outside_debug(name: str) -> None:
    environ = {k: v for k, v in TEST_SECRETS.items() if k != name}
    with pytest.raises(SettingsError, match=name):
        Settings.from_environ(environ)
    Settings.from_environ({**environ, "MLPA_DEBUG": "true"})
    Settings.from_environ(environ, demo=True)


def test_secrets_never_in_repr() -> None:
    text = repr(Settings.from_environ(TEST_SECRETS))
    for secret in TEST_KEYS.values():
        assert secret not in text


def test_variable_names_cover_the_reference_names() -> None:
    names = variable_names()
    for name in ("PORT", "LITELLM_API_BASE", "MLPA_VIRTUAL_KEY", "STREAMING_TIMEOUT_SECONDS", "USER_FEATURE_BUDGET_AI_BUDGET_ID"):
        assert name in names


# --- one default per setting ----------------------------------------------------------------

def differences(read: object, built: object, path: str = "") -> list[str]:
    """Every field (nested sections included) whose value differs, by its path."""
    if not dataclasses.is_dataclass(read):
        return [] if read == built else [f"{path}: read {read!r}, dataclass default {built!r}"]
    found = []
    for spec in dataclasses.fields(read):
        found += differences(getattr(read, spec.name), getattr(built, spec.name), f"{path}.{spec.name}".lstrip("."))
    return found


def test_the_reader_falls_back_to_the_dataclass_defaults() -> None:
    reading = Settings.read_environ({}, check_secrets=False)
    assert reading.problems == ()
    assert differences(reading.settings, Settings()) == []


def test_demo_changes_exactly_the_demo_defaults() -> None:
    assert set(DEMO_DEFAULTS) == {"MLPA_STORE", "MLPA_MOCK_ROUTES"}
    expected = dataclasses.replace(
        Settings(), store="memory", server=dataclasses.replace(ServerSettings(), mock_routes=True)
    )
    assert differences(Settings.from_environ({}, demo=True), expected) == []
    # Explicit values still win over the demo's defaults.
    settings = Settings.from_environ({"MLPA_STORE": "postgres", "MLPA_MOCK_ROUTES": "false"}, demo=True)
    assert (settings.store, settings.server.mock_routes) == ("postgres", False)


def test_debug_changes_exactly_the_debug_defaults() -> None:
    assert set(DEBUG_DEFAULTS) == {"FXA_BASE_URL"}
    expected = dataclasses.replace(
        Settings(),
        server=dataclasses.replace(ServerSettings(), debug=True),
        fxa=dataclasses.replace(FxASettings(), base_url=FXA_STAGE_URL),
    )
    assert differences(Settings.from_environ({"MLPA_DEBUG": "true"}), expected) == []


def test_the_refused_secrets_and_their_defaults() -> None:
    # compatibility.md D13's list; each default is the field's, which an unset variable yields.
    assert set(DEFAULT_SECRETS) == {
        "MASTER_KEY",
        "MLPA_VIRTUAL_KEY",
        "MLPA_UI_ACCESS_KEY",
        "MLPA_ACCESS_TOKEN_SECRET",
        "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN",
        # Refused only while PRIVACY_FILTER_ENABLED is on (tests/unit/test_privacy_filter.py).
        "PRIVACY_FILTER_MASTER_KEY",
    }
    defaults = Settings()
    assert DEFAULT_SECRETS == {
        "MASTER_KEY": defaults.upstream.master_key,
        "MLPA_VIRTUAL_KEY": defaults.upstream.virtual_key,
        "MLPA_UI_ACCESS_KEY": defaults.auth.ui_access_key,
        "MLPA_ACCESS_TOKEN_SECRET": defaults.auth.access_token_secret,
        "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": defaults.auth.experimentation_token,
        "PRIVACY_FILTER_MASTER_KEY": defaults.privacy_filter.master_key,
    }
    # The service has always run with this dev token when the variable is unset.
    assert defaults.auth.experimentation_token == "secret-dev-token"


def test_the_read_timeout_follows_the_streaming_timeout_unless_set() -> None:
    # compatibility.md D4, in the dataclass and in the reader.
    assert Settings().upstream.read_timeout_seconds == Settings().upstream.streaming_timeout_seconds
    debug = {"MLPA_DEBUG": "true"}
    upstream = Settings.from_environ({**debug, "STREAMING_TIMEOUT_SECONDS": "42"}).upstream
    assert upstream.read_timeout_seconds == upstream.streaming_timeout_seconds == 42.0
    upstream = Settings.from_environ({**debug, "STREAMING_TIMEOUT_SECONDS": "42", "UPSTREAM_READ_TIMEOUT_SECONDS": "7"}).upstream
    assert (upstream.streaming_timeout_seconds, upstream.read_timeout_seconds) == (42.0, 7.0)


def test_invalid_values_fall_back_to_the_field_default_when_read_leniently() -> None:
    environ = {"PORT": "eighty", "LOG_LEVEL": "loud", "PG_COMMAND_TIMEOUT_S": "-1"}
    reading = Settings.read_environ(environ, check_secrets=False)
    assert [problem.split(":", 1)[0] for problem in reading.problems] == ["PORT", "LOG_LEVEL", "PG_COMMAND_TIMEOUT_S"]
    assert differences(reading.settings, Settings()) == []
    with pytest.raises(SettingsError) as raised:
        Settings.from_environ(environ, check_secrets=False)
    assert raised.value.problems == reading.problems


def test_connection_environ_reads_back_as_the_same_databases() -> None:
    pg = PostgresSettings(host="db.internal", port=6543, username="mlpa", password="s3cret", litellm_db_name="ll", app_attest_db_name="aa")
    read = Settings.from_environ({**TEST_SECRETS, **pg.connection_environ()}).postgres
    names = ("host", "port", "username", "password", "litellm_db_name", "app_attest_db_name")
    assert [getattr(read, name) for name in names] == [getattr(pg, name) for name in names]
