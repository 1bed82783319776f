"""config/gunicorn.conf.py takes the app's variables from `Settings`: same defaults, same
rules, same messages. Only gunicorn's own variables (workers, worker class) are parsed there."""

from __future__ import annotations

import math
import runpy
from pathlib import Path
from typing import Any, Mapping

import pytest

from mlpa_aiohttp.settings import ServerSettings, Settings, variable_names
from mlpa_aiohttp.settings.compat import RENAMED

from ..conftest import TEST_SECRETS

GUNICORN_CONF = Path(__file__).resolve().parents[2] / "config" / "gunicorn.conf.py"
GUNICORN_ONLY = ("GUNICORN_WORKERS", "WEB_CONCURRENCY", "GUNICORN_WORKER_CLASS")


def load(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> dict[str, Any]:
    """Evaluate the config file as gunicorn's master does, with exactly `env` set."""
    for name in {*variable_names(), *RENAMED, *GUNICORN_ONLY}:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(GUNICORN_CONF))


def effective(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "bind": conf["bind"],
        "backlog": conf["backlog"],
        "graceful_timeout": conf["graceful_timeout"],
        "keepalive": conf["keepalive"],
        "loglevel": conf["loglevel"],
        "json": conf["logconfig_dict"]["formatters"]["service"]["json"],
    }


def expected_from(server: ServerSettings, conf: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "bind": [f"0.0.0.0:{server.port}"],
        "backlog": server.listen_backlog,
        "graceful_timeout": conf["graceful_timeout_for"](server.shutdown_drain_seconds),
        "keepalive": math.ceil(server.keepalive_timeout_seconds),
        "loglevel": server.log_level.lower(),
        "json": server.log_json,
    }


@pytest.mark.parametrize(
    "env",
    [
        {},
        {
            "PORT": "9123",
            "LISTEN_BACKLOG": "77",
            "SHUTDOWN_DRAIN_SECONDS": "33.5",
            "KEEPALIVE_TIMEOUT_SECONDS": "61.2",
            "LOGURU_LEVEL": "warning",  # the reference's name, an alias in the settings
            "LOG_JSON": "yes",
        },
        {"LOG_LEVEL": " Error ", "LOG_JSON": "off", "PORT": "0"},
    ],
    ids=["defaults", "set", "spellings"],
)
def test_gunicorn_values_come_from_the_settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    conf = load(monkeypatch, env)
    server = Settings.from_environ(env, check_secrets=False).server
    assert effective(conf) == expected_from(server, conf)
    assert conf["problems"] == []
    if not env:
        assert server == ServerSettings()


def test_gunicorn_reports_the_settings_problems_word_for_word(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "PORT": "eighty",
        "LISTEN_BACKLOG": "0",
        "SHUTDOWN_DRAIN_SECONDS": "inf",
        "KEEPALIVE_TIMEOUT_SECONDS": "-1",
        "LOG_LEVEL": "loud",
        "LOG_JSON": "maybe",
    }
    conf = load(monkeypatch, env)
    reading = Settings.read_environ(env, check_secrets=False)
    assert conf["problems"] == list(reading.problems)
    assert {problem.split(":", 1)[0] for problem in conf["problems"]} == set(env)
    # Meanwhile every value is the default, as the settings fall back to it.
    assert reading.settings.server == ServerSettings()
    assert effective(conf) == expected_from(ServerSettings(), conf)


def test_every_problem_is_reported_once_with_the_secret_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**TEST_SECRETS, "PORT": "eighty", "WEB_CONCURRENCY": "zero", "MASTER_KEY": "sk-default"}
    conf = load(monkeypatch, env)
    found = conf["check_configuration"]()
    assert sorted(problem.split(":", 1)[0] for problem in found) == ["MASTER_KEY", "PORT", "WEB_CONCURRENCY"]


def test_the_prometheus_directory_is_the_settings_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    conf = load(monkeypatch, {**TEST_SECRETS, "PROMETHEUS_MULTIPROC_DIR": f"  {directory}  "})

    class Arbiter:
        pidfile = None
        LISTENERS: list[Any] = []

        class cfg:  # noqa: N801 - gunicorn's settings object: nothing to bind
            reuse_port = False
            address: list[Any] = []

        class log:  # noqa: N801 - stands in for gunicorn's logger object
            @staticmethod
            def info(*args: Any) -> None:
                pass

    conf["on_starting"](Arbiter())
    assert directory.is_dir()  # created from the stripped value the settings read
