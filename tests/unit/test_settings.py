"""Settings: names carried over from the reference, clear failures, refused default secrets."""

from __future__ import annotations

import pytest

from mlpa_aiohttp.catalog import ServiceType
from mlpa_aiohttp.settings import FXA_PRODUCTION_URL, FXA_STAGE_URL, Settings, SettingsError, variable_names

from ..conftest import TEST_SECRETS


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
    # Decision 4: the non-streaming timeout follows the streaming one by default.
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
    for secret in TEST_SECRETS.values():
        assert secret not in text


def test_variable_names_cover_the_reference_names() -> None:
    names = variable_names()
    for name in ("PORT", "LITELLM_API_BASE", "MLPA_VIRTUAL_KEY", "STREAMING_TIMEOUT_SECONDS", "USER_FEATURE_BUDGET_AI_BUDGET_ID"):
        assert name in names
