"""Misspelled variable names are named, whatever their prefix, and only ours: the platform's
and the interpreter's own names are never taken for misspellings (settings/compat.py)."""

from __future__ import annotations

import io
import json

import pytest

from mlpa_aiohttp.observability.logging import log_startup_failure
from mlpa_aiohttp.settings import Settings, SettingsError, variable_names
from mlpa_aiohttp.settings.compat import environment_notices, unknown_variable_notes
from mlpa_aiohttp.process.startup import EXIT_CONFIG, report_config_error

from ..conftest import TEST_SECRETS

MISSPELLINGS = {
    "MLPA_VIRTAUL_KEY": "MLPA_VIRTUAL_KEY",
    "LOG_LEVLE": "LOG_LEVEL",
    "DB_PROT": "DB_PORT",
    "STREAMING_TIMEOUT_SECOND": "STREAMING_TIMEOUT_SECONDS",
    "MASTERKEY": "MASTER_KEY",
    "RELAY_FASTPATH": "RELAY_FAST_PATH",
    "GUNICORN_WORKER": "GUNICORN_WORKERS",  # read by config/gunicorn.conf.py, not the settings
}

# What a shell, a container image, CI and a Kubernetes pod set besides our variables.
FOREIGN = {
    "PATH": "/usr/bin", "HOME": "/root", "HOSTNAME": "mlpa-7d9f", "HOST": "box", "USER": "app", "SHELL": "/bin/sh",
    "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "xterm", "PWD": "/app", "OLDPWD": "/", "TZ": "UTC", "SHLVL": "1",
    "TMPDIR": "/tmp", "DEBUG": "1", "VIRTUAL_ENV": "/app/.venv", "GPG_KEY": "A035C8C1",
    "PYTHONPATH": "/app", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
    "PYTHON_VERSION": "3.11.9", "PYTHON_SHA256": "abc", "PYTHON_PIP_VERSION": "24.0",
    "PIP_NO_CACHE_DIR": "1", "HTTP_PROXY": "", "HTTPS_PROXY": "", "NO_PROXY": "localhost",
    "PGHOST": "db", "PGPORT": "5432", "PGUSER": "app", "PGPASSWORD": "pw", "PGDATABASE": "app",
    "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
    "KUBERNETES_PORT": "tcp://10.0.0.1:443", "KUBERNETES_PORT_443_TCP": "tcp://10.0.0.1:443",
    "KUBERNETES_PORT_443_TCP_ADDR": "10.0.0.1", "KUBERNETES_PORT_443_TCP_PORT": "443",
    "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
    # The service links of our own Service (`mlpa`, config/kubernetes/base/service.yaml).
    "MLPA_SERVICE_HOST": "10.0.0.9", "MLPA_SERVICE_PORT": "80", "MLPA_SERVICE_PORT_HTTP": "80",
    "MLPA_PORT": "tcp://10.0.0.9:80", "MLPA_PORT_80_TCP": "tcp://10.0.0.9:80", "MLPA_PORT_80_TCP_ADDR": "10.0.0.9",
    "MLPA_PORT_80_TCP_PORT": "80", "MLPA_PORT_80_TCP_PROTO": "tcp",
    "SENTRY_ENVIRONMENT": "prod", "GOOGLE_APPLICATION_CREDENTIALS": "/var/run/key.json", "WEB_CONCURRENCY": "1",
}


def unknown(environ: dict[str, str]) -> dict[str, str | None]:
    return {
        n.fields["variable"]: n.fields.get("did_you_mean")
        for n in environment_notices(environ, variable_names())
        if n.event == "setting_unknown"
    }


@pytest.mark.parametrize("typo", sorted(MISSPELLINGS))
def test_a_misspelled_name_is_named_with_the_one_meant(typo: str) -> None:
    assert unknown({typo: "1"}) == {typo: MISSPELLINGS[typo]}


def test_the_platforms_names_are_not_misspellings_of_ours() -> None:
    assert unknown(FOREIGN) == {}
    # A <NAME>_PORT is a service link only with the link's value.
    assert "MLPA_PORT" in unknown({"MLPA_PORT": "8080"})


@pytest.mark.parametrize("typo", sorted(MISSPELLINGS))
def test_a_configuration_error_names_the_misspelling_in_its_one_message(typo: str) -> None:
    """The misspelled name is why the intended variable reads as "not set" (or default)."""
    environ = {**FOREIGN, "MASTER_KEY": "sk-default", typo: "value-not-shown"}
    with pytest.raises(SettingsError) as raised:
        Settings.from_environ(environ)
    for as_json in (False, True):
        stream = io.StringIO()
        log_startup_failure(
            "configuration_error", raised.value.problems, exit_code=EXIT_CONFIG, hint="see README", json=as_json,
            unknown_variables=unknown_variable_notes(environ, variable_names()), stream=stream,
        )
        text = stream.getvalue()
        assert "value-not-shown" not in text
        if as_json:
            record = json.loads(text)
            assert record["unknown_variables"] == [f"{typo} (did you mean {MISSPELLINGS[typo]}?)"]
            assert any(problem.startswith("MASTER_KEY:") for problem in record["problems"])
        else:
            assert f"  - {typo} (did you mean {MISSPELLINGS[typo]}?)\n" in text
            assert "  - MASTER_KEY: still the documented default" in text


def test_report_config_error_reads_the_names_from_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    environ = {k: v for k, v in TEST_SECRETS.items() if k != "MLPA_VIRTUAL_KEY"} | {"MLPA_VIRTAUL_KEY": "sk-real"}
    with pytest.raises(SettingsError) as raised:
        Settings.from_environ(environ)
    assert report_config_error(raised.value, environ) == EXIT_CONFIG
    message = capsys.readouterr().err
    assert "MLPA_VIRTUAL_KEY: not set" in message
    assert "MLPA_VIRTAUL_KEY (did you mean MLPA_VIRTUAL_KEY?)" in message and "sk-real" not in message


def test_without_unknown_names_one_problem_stays_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_config_error(["PORT: expected an integer, got 'x'"], FOREIGN) == EXIT_CONFIG
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("CRITICAL configuration_error: PORT: expected an integer")
