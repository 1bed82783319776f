"""`python -m mlpa_aiohttp` as a person runs it, in real processes: help that names the
variables, --version, serve --host/--port, clear one-line errors (a bad PORT, a busy port)
and a demo that prints what it made and reports what it really has."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest

from mlpa_aiohttp import __version__
from mlpa_aiohttp.routes.health import MEMORY_STORE_STATE
from mlpa_aiohttp.settings import variable_names
from mlpa_aiohttp.settings.compat import READ_ELSEWHERE
from tests.support.processes import free_port, running_demo

REPO = Path(__file__).resolve().parents[2]

SUBCOMMANDS = ("serve", "demo", "fake-upstream", "migrate")
# Read by config/gunicorn.conf.py or by libraries, not by the settings.
OTHER_VARIABLES = frozenset(READ_ELSEWHERE)


def cli(*args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"mlpa-aiohttp {__version__}"


def test_top_level_help_lists_the_commands_and_where_variables_are_named() -> None:
    result = cli("--help", PORT="eighty")
    assert result.returncode == 0
    for command in SUBCOMMANDS:
        assert command in result.stdout
    assert "COMMAND --help names the variables" in result.stdout and "78" in result.stdout


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_names_the_variables_even_with_a_bad_port(command: str) -> None:
    result = cli(command, "--help", PORT="eighty")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "environment:" in text and "exit statuses:" in text
    named = set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\bPORT\b", text))
    assert not named - variable_names() - OTHER_VARIABLES, "help names a variable nothing reads"
    expected = {
        "serve": {"PORT", "LITELLM_API_BASE", "MLPA_ACCESS_TOKEN_SECRET", "DB_HOST", "LOG_JSON"},
        "demo": {"PORT", "LOG_LEVEL"},
        "fake-upstream": set(),
        "migrate": {"DB_HOST", "DB_PORT", "DB_USERNAME", "DB_PASSWORD", "APP_ATTEST_DB_NAME", "MLPA_MAX_SIGNED_IN_USERS"},
    }[command]
    assert expected <= named, expected - named
    if command == "serve":
        assert "docs/configuration.md" in text and "32 bytes" in text and "--host" in text


@pytest.mark.parametrize(("form", "committed"), [("--markdown", "docs/configuration.md"), ("--env", "config/example.env")])
def test_config_prints_the_committed_reference_whatever_the_environment(form: str, committed: str) -> None:
    """The reference shows defaults: a variable set (even an invalid one) changes nothing."""
    result = cli("config", form, PORT="eighty", MLPA_STORE="memory")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / committed).read_text(encoding="utf-8")


def test_config_needs_a_form() -> None:
    result = cli("config")
    assert result.returncode == 2
    assert "one of the arguments --markdown --env is required" in result.stderr


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_non_integer_port_is_one_line_with_exit_status_78(command: str) -> None:
    result = cli(command, PORT="eighty", MLPA_DEBUG="true")
    assert result.returncode == 78
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "PORT: expected an integer, got 'eighty'" in line and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_busy_port_is_one_line_with_the_fix(command: str, busy_port: int) -> None:
    args = ["--host", "127.0.0.1"] if command == "serve" else []
    result = cli(command, *args, "--port", str(busy_port), MLPA_DEBUG="true", MLPA_STORE="memory")
    assert result.returncode == 71, result.stderr
    (line,) = result.stderr.splitlines()
    assert f"port {busy_port} on 127.0.0.1 is already in use" in line and "--port" in line


async def test_serve_listens_where_it_is_told() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "MLPA_DEBUG": "true", "MLPA_STORE": "memory", "LITELLM_API_BASE": "http://127.0.0.1:9"},
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health/liveness") as response:
                        assert response.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    assert process.poll() is None, process.stdout.read()
                    await asyncio.sleep(0.05)
            else:
                pytest.fail("serve never answered")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0


async def test_demo_prints_its_urls_and_keys_and_reports_what_it_has() -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "MLPA_UI_ACCESS_KEY"}, "LOG_LEVEL": "WARNING"}
    with running_demo(env) as (process, port):
        banner = []
        while not banner or "Ctrl-C" not in banner[-1]:
            line = process.stdout.readline()
            assert line, "".join(banner)
            banner.append(line)
        text = "".join(banner)
        base = f"http://127.0.0.1:{port}"
        urls = dict(re.findall(r"^  (API docs|admin page|metrics|readiness) +(\S+)", text, re.MULTILINE))
        assert urls == {
            "API docs": f"{base}/api/docs",
            "admin page": f"{base}/admin",
            "metrics": f"{base}/metrics",
            "readiness": f"{base}/health/readiness",
        }
        ui_key = re.search(r"MLPA_UI_ACCESS_KEY +(\S+)", text).group(1)
        token = re.search(r"FxA bearer token +(\S+)", text).group(1)
        assert f"curl -N {base}/v1/chat/completions -H 'authorization: Bearer {token}'" in text
        assert f"curl {base}/privacy-filter -H 'authorization: Bearer {token}'" in text
        async with aiohttp.ClientSession() as session:
            # The demo's fake Privacy Filter masks what the printed curl sends.
            async with session.post(
                f"{base}/privacy-filter", json={"items": ["mail jane@example.com"]}, headers={"authorization": f"Bearer {token}"}
            ) as response:
                assert response.status == 200
                assert (await response.json())["results"][0]["masked_text"] == "mail [EMAIL]"
            for url in urls.values():
                async with session.get(url) as response:
                    assert response.status == 200, url
                    if url.endswith("/readiness"):
                        readiness = await response.json()
            # The printed key is the one the service checks.
            async with session.get(f"{base}/user/counts-by-service-type", headers={"mlpa-ui-access-key": f"Bearer {ui_key}"}) as response:
                assert response.status == 200
            async with session.get(f"{base}/user/counts-by-service-type", headers={"mlpa-ui-access-key": "Bearer sk-ui-access-default"}) as response:
                assert response.status == 401
        assert readiness["status"] == "connected"
        assert readiness["privacy_filter"] == {"version": "0.3.1", "model_id": "pii-filter"}
        assert readiness["pg_server_dbs"] == {"postgres": MEMORY_STORE_STATE, "app_attest": MEMORY_STORE_STATE}


@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_postgres_out_of_reach_is_one_line_with_exit_status_69(command: str) -> None:
    result = cli(command, MLPA_DEBUG="true", MLPA_STORE="postgres", DB_HOST="127.0.0.1", DB_PORT=str(free_port()), PORT=str(free_port()))
    assert result.returncode == 69, result.stderr
    (line,) = result.stderr.splitlines()
    assert "database_unavailable: cannot connect to PostgreSQL at 127.0.0.1:" in line and "DB_HOST" in line
