"""One log format under real gunicorn with LOG_JSON=true, start-up errors included: every
line gunicorn's master, its workers and the app write (stdout and stderr) is one JSON
object; a configuration error is one message listing every problem, with no traceback,
before anything binds; PostgreSQL out of reach is one message and gunicorn's exit status 3."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path

import aiohttp

from ..conftest import TEST_SECRETS, chat_body
from tests.support.gunicorn import GUNICORN, json_lines, json_log_env, run_to_exit
from tests.support.processes import REPO_ROOT, free_port


async def test_every_line_is_json_from_start_to_stop(fake_litellm_server, fake_fxa_server, tmp_path: Path) -> None:
    (_, litellm_server), (fxa, fxa_server) = fake_litellm_server, fake_fxa_server
    port = free_port()
    env = json_log_env(
        **TEST_SECRETS,
        PORT=str(port),
        MLPA_STORE="memory",
        LITELLM_API_BASE=str(litellm_server.make_url("")).rstrip("/"),
        FXA_BASE_URL=str(fxa_server.make_url("/v1")),
    )
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(GUNICORN, cwd=REPO_ROOT, env=env, stdout=stdout, stderr=stderr)
        try:
            deadline = time.monotonic() + 20
            headers = {"authorization": f"Bearer {fxa.issue_jwt('log-user')}", "service-type": "ai"}
            async with aiohttp.ClientSession() as session:
                while True:
                    assert process.poll() is None, out.read_text() + err.read_text()
                    try:
                        async with session.get(f"http://127.0.0.1:{port}/health/liveness") as response:
                            if response.status == 200:
                                break
                    except aiohttp.ClientConnectionError:
                        pass
                    assert time.monotonic() < deadline, out.read_text() + err.read_text()
                    await asyncio.sleep(0.1)
                async with session.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=chat_body(stream=True), headers=headers
                ) as response:
                    assert response.status == 200
                    assert (await response.read()).endswith(b"data: [DONE]\n\n")
                async with session.get(f"http://127.0.0.1:{port}/no-such-page") as response:
                    assert response.status == 404
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0

    events = json_lines(out.read_text(), "stdout") + json_lines(err.read_text(), "stderr")
    messages = [event["event"] for event in events]
    # gunicorn's master and worker lines, and the app's own, all in the one format.
    for expected in ("Starting gunicorn", "Booting worker", "Worker ready", "Handling signal: term", "Shutting down: Master"):
        assert any(message.startswith(expected) for message in messages), (expected, messages)
    requests = {(e["path"], e["status"]) for e in events if e["event"] == "request"}
    assert {("/v1/chat/completions", 200), ("/no-such-page", 404)} <= requests, requests
    assert all({"event", "level", "logger", "timestamp"} <= set(event) for event in events)
    # The clean stop no longer logs uvloop's second close of gunicorn's socket.
    assert not [m for m in messages if "Error while closing socket" in m], messages
    assert not [e for e in events if e["level"] in ("error", "critical")], events


def test_a_configuration_error_is_one_json_message_listing_every_problem(tmp_path: Path) -> None:
    env = json_log_env(
        PORT=str(free_port()),
        GUNICORN_WORKERS="two",
        MLPA_STORE="redis",
        MASTER_KEY="sk-default",
        MLPA_VIRTUAL_KEY="sk-real-virtual",
        MLPA_UI_ACCESS_KEY="sk-real-ui",
        MLPA_ACCESS_TOKEN_SECRET="too-short",
        MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN="",
        # Without them the platform checks (D63) would add their own lines.
        APP_ATTEST_ENABLED="false",
        PLAY_INTEGRITY_ENABLED="false",
    )
    status, stdout, stderr = run_to_exit(env, tmp_path)
    assert status == 78
    errors = [e for e in stdout + stderr if e["event"] == "configuration_error"]
    assert len(errors) == 1, stdout + stderr
    (error,) = errors
    problems = {problem.split(":", 1)[0]: problem for problem in error["problems"]}
    assert set(problems) == {"GUNICORN_WORKERS", "MLPA_STORE", "MASTER_KEY", "MLPA_ACCESS_TOKEN_SECRET"}
    assert "at least 32 bytes" in problems["MLPA_ACCESS_TOKEN_SECRET"]
    assert error["exit_code"] == 78 and error["level"] == "critical"
    everything = json.dumps(stdout + stderr)
    assert "Traceback" not in everything and "too-short" not in everything
    # Stopped before binding or forking: no worker was booted.
    assert not [e for e in stdout + stderr if str(e["event"]).startswith(("Listening at", "Booting worker"))]


def test_postgres_down_at_start_is_one_json_message_and_exit_status_3(tmp_path: Path) -> None:
    env = json_log_env(**TEST_SECRETS, PORT=str(free_port()), MLPA_STORE="postgres", DB_HOST="127.0.0.1", DB_PORT=str(free_port()))
    status, stdout, stderr = run_to_exit(env, tmp_path)
    assert status == 3  # gunicorn's own status for a worker that failed to boot
    events = stdout + stderr
    (failure,) = [e for e in events if e["event"] == "database_unavailable"]
    assert "cannot connect to PostgreSQL at 127.0.0.1:" in failure["problems"][0]
    assert "Traceback" not in json.dumps(events)
    assert any(e["event"] == "Reason: Worker failed to boot." for e in events)
    assert len(events) <= 12, events
