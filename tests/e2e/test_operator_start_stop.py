"""What an operator reads when the service starts and stops, in real processes: `serve` says
where it listens and that it stopped, warns once (no traceback) when LiteLLM is not there
and starts anyway; gunicorn refuses a taken port with one line and status 71, and a worker
whose app cannot start never says it is ready."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest

from mlpa_aiohttp.process.startup import EXIT_CANNOT_LISTEN, GUNICORN_WORKER_BOOT_ERROR
from tests.support.processes import free_port

from ..conftest import TEST_SECRETS

REPO_ROOT = Path(__file__).resolve().parents[2]
GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"]


def clean_environ(**extra: str) -> dict[str, str]:
    """Only `PATH` of the test process's environment (so no name of the machine's is
    warned about), then `extra`."""
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO_ROOT),
        "LOG_JSON": "true",
        "LOG_LEVEL": "INFO",
        **extra,
    }


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(isinstance(line, dict) for line in lines)
    return lines


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound and released, so no one else took it)."""
    return free_port()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


async def wait_for_liveness(base_url: str, process: subprocess.Popen[bytes], output: Path) -> None:
    deadline = time.monotonic() + 20
    async with aiohttp.ClientSession() as session:
        while True:
            assert process.poll() is None, output.read_text()
            try:
                async with session.get(f"{base_url}/health/liveness") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            assert time.monotonic() < deadline, output.read_text()
            await asyncio.sleep(0.05)


async def test_serve_warns_once_that_litellm_is_unreachable_and_says_where_it_listens_and_that_it_stopped(
    closed_port: int, tmp_path: Path
) -> None:
    port = free_port()
    litellm_url = f"http://127.0.0.1:{closed_port}"
    env = clean_environ(MLPA_DEBUG="true", MLPA_STORE="memory", LITELLM_API_BASE=litellm_url)
    stdout_path, stderr_path = tmp_path / "stdout", tmp_path / "stderr"
    with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT, env=env, stdout=stdout, stderr=stderr,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            await wait_for_liveness(base, process, stdout_path)
            # Started anyway; readiness says what the warning said, and stays 200: LiteLLM is
            # shared by every pod, so this pod stays in the Service (compatibility.md D64).
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/health/readiness") as response:
                    assert response.status == 200
                    body = await response.json()
                    assert body["status"] == "degraded" and body["litellm"]["status"] == "unreachable"
            deadline = time.monotonic() + 15
            while "litellm_unreachable" not in stdout_path.read_text():
                assert time.monotonic() < deadline, stdout_path.read_text()
                await asyncio.sleep(0.05)
        finally:
            process.send_signal(signal.SIGTERM)
            status = process.wait(timeout=20)
    assert status == 0
    lines = json_lines(stdout_path.read_text()) + json_lines(stderr_path.read_text())
    everything = stdout_path.read_text() + stderr_path.read_text()
    assert "Traceback" not in everything
    # Besides the readiness request this test made, the one start-up warning.
    warnings = [line for line in lines if line["level"] == "warning" and line["event"] != "readiness_litellm_check_failed"]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert warning["event"] == "litellm_unreachable"
    assert not [line for line in lines if line["level"] in ("error", "critical")], lines
    assert warning["url"] == litellm_url and warning["cause"] == "connection refused"
    events = [line["event"] for line in lines]
    assert events.count("serve_listening") == 1 and events.count("serve_stopped") == 1, events
    (listening,) = [line for line in lines if line["event"] == "serve_listening"]
    assert listening["address"] == f"127.0.0.1:{port}" and listening["level"] == "info"
    assert events.index("serve_listening") < events.index("serve_stopped") == len(events) - 1


def test_gunicorn_refuses_a_taken_port_with_one_line_and_status_71(busy_port: int, tmp_path: Path) -> None:
    env = clean_environ(**TEST_SECRETS, MLPA_STORE="memory", PORT=str(busy_port), LOG_JSON="false")
    done = subprocess.run(GUNICORN, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == EXIT_CANNOT_LISTEN, done.stdout + done.stderr
    (message,) = done.stderr.splitlines()
    assert message.startswith("CRITICAL port_unavailable: ")
    assert f"port {busy_port} on 0.0.0.0 is already in use" in message and "PORT" in message
    # Stopped before gunicorn's own bind: no retries, no worker.
    output = done.stdout + done.stderr
    for sign in ("Connection in use", "Retrying", "Booting worker", "Traceback"):
        assert sign not in output, output


def test_a_gunicorn_worker_whose_app_cannot_start_never_says_it_is_ready(closed_port: int, tmp_path: Path) -> None:
    env = clean_environ(
        **TEST_SECRETS, PORT=str(free_port()), MLPA_STORE="postgres", DB_HOST="127.0.0.1", DB_PORT=str(closed_port)
    )
    done = subprocess.run(GUNICORN, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == GUNICORN_WORKER_BOOT_ERROR, done.stdout + done.stderr
    events = [line["event"] for line in json_lines(done.stdout) + json_lines(done.stderr)]
    assert any(event.startswith("Booting worker") for event in events), events
    assert not any(event.startswith("Worker ready") for event in events), events
    (failure,) = [line for line in json_lines(done.stderr) if line["event"] == "database_unavailable"]
    assert "DB_HOST" in failure["hint"] and "migrate" in failure["hint"]


MISSPELLED = {
    "LOG_LEVLE": "LOG_LEVEL",
    "DB_PROT": "DB_PORT",
    "STREAMING_TIMEOUT_SECOND": "STREAMING_TIMEOUT_SECONDS",
    "MASTERKEY": "MASTER_KEY",
    "RELAY_FASTPATH": "RELAY_FAST_PATH",
}


@pytest.mark.parametrize("runner", ["serve", "gunicorn"])
def test_a_misspelled_secret_is_named_in_the_configuration_error(runner: str) -> None:
    secrets = {k: v for k, v in TEST_SECRETS.items() if k != "MLPA_VIRTUAL_KEY"}
    env = clean_environ(**secrets, MLPA_VIRTAUL_KEY="sk-meant-as-virtual", PORT=str(free_port()), MLPA_STORE="memory")
    argv = GUNICORN if runner == "gunicorn" else [sys.executable, "-m", "mlpa_aiohttp", "serve"]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 78, done.stdout + done.stderr
    (error,) = [line for line in json_lines(done.stdout) + json_lines(done.stderr) if line["event"] == "configuration_error"]
    assert [problem.split(":")[0] for problem in error["problems"]] == ["MLPA_VIRTUAL_KEY"]
    assert error["unknown_variables"] == ["MLPA_VIRTAUL_KEY (did you mean MLPA_VIRTUAL_KEY?)"]
    assert "sk-meant-as-virtual" not in done.stdout + done.stderr


async def test_misspelled_names_in_a_valid_configuration_are_warnings_at_start(tmp_path: Path) -> None:
    port = free_port()
    env = clean_environ(
        MLPA_DEBUG="true", MLPA_STORE="memory", LITELLM_API_BASE=f"http://127.0.0.1:{free_port()}",
        **{name: "1" for name in MISSPELLED},
    )
    output = tmp_path / "output"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
        try:
            await wait_for_liveness(f"http://127.0.0.1:{port}", process, output)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
    lines = json_lines(output.read_text())
    unknown = {line["variable"]: line.get("did_you_mean") for line in lines if line["event"] == "setting_unknown"}
    assert unknown == MISSPELLED
    assert all(line["level"] == "warning" for line in lines if line["event"] == "setting_unknown")


async def test_gunicorn_warns_once_per_worker_that_litellm_is_unreachable(closed_port: int, tmp_path: Path) -> None:
    port = free_port()
    litellm_url = f"http://127.0.0.1:{closed_port}"
    env = clean_environ(**TEST_SECRETS, PORT=str(port), MLPA_STORE="memory", LITELLM_API_BASE=litellm_url, GUNICORN_WORKERS="1")
    output = tmp_path / "output"
    with output.open("wb") as sink:
        process = subprocess.Popen(GUNICORN, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            await wait_for_liveness(f"http://127.0.0.1:{port}", process, output)
            deadline = time.monotonic() + 15
            while "litellm_unreachable" not in output.read_text():
                assert time.monotonic() < deadline, output.read_text()
                await asyncio.sleep(0.05)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
    lines = json_lines(output.read_text())
    warnings = [line for line in lines if line["level"] == "warning"]
    assert [(w["event"], w["url"], w["cause"]) for w in warnings] == [("litellm_unreachable", litellm_url, "connection refused")]
    assert "Traceback" not in output.read_text()
    # Ready is said once the app started; the warning may come before or after it.
    events = [line["event"] for line in lines]
    assert sum(event.startswith("Worker ready") for event in events) == 1
