"""The catalogue file in real processes: a bad file refused at start with every problem in
one message (exit 78) under `serve` and under gunicorn; `catalog check`/`show`; a new file
taking effect with gunicorn's HUP while streams are open, none of them cut; and a broken
file on HUP refused with one ERROR while the last good catalogue goes on being served."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG, BudgetTier, Catalog, ServiceTypeEntry
from mlpa_aiohttp.catalog.file import render_catalog

from ..conftest import TEST_SECRETS, chat_body
from tests.support.gunicorn import Gunicorn, gunicorn_on_fakes, json_lines, json_log_env, run_to_exit, wait_until_live
from tests.support.processes import REPO_ROOT, free_port

DONE = b"data: [DONE]\n\n"

# One mistake of each kind the loader reports, in file order.
BAD_CATALOG = """\
search_service_types = ["search", "serch"]

[[service_type]]
name = "ai"
purpose = ["chat"]
budget = { max_budget = "ten", rpm_limit = 40, tpm_limit = 2000 }

[[service_type]]
name = "search"
budget = { max_budget = 0.01, rpm_limit = 10, tpm_limit = 2000 }

[[service_type]]
name = "search"
budget = { max_budget = 0.01, rpm_limit = 10, tpm_limit = 2000 }

[[service_type]]
name = "Quick Answers"
budget = { max_budget = 0.1, rpm_limit = 10, tpm_limit = 2000 }

[[model]]
name = "liner"
pinned_to = ["liner-answer"]
"""
EXPECTED_PROBLEMS = [
    "service_type #1 'ai': unknown key 'purpose'; did you mean 'purposes'?",
    "service_type #1 'ai'.budget.max_budget: expected a number of at least 0 (USD), got 'ten'",
    "service_type #3 'search': duplicate service type 'search' (also service_type #2)",
    "service_type #4 'Quick Answers': service type name 'Quick Answers' is not allowed",
    "search_service_types: 'serch' is not a service type of this file; did you mean 'search'?",
    "model #1 'liner'.pinned_to: 'liner-answer' is not a service type of this file",
]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", *args], capture_output=True, text=True, timeout=30, env={**os.environ, **env}
    )


def assert_every_problem_listed(problems: list[str], path: Path) -> None:
    assert len(problems) == len(EXPECTED_PROBLEMS), problems
    for problem, expected in zip(problems, EXPECTED_PROBLEMS):
        assert problem.startswith(f"MLPA_CATALOG_FILE ({path}): {expected}"), (problem, expected)


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(BAD_CATALOG)
    return path


def test_serve_refuses_a_bad_file_listing_every_problem(bad_file: Path) -> None:
    result = cli("serve", "--port", str(free_port()), MLPA_CATALOG_FILE=str(bad_file), MLPA_DEBUG="true", MLPA_STORE="memory", LOG_JSON="true")
    assert result.returncode == 78, result.stderr
    (error,) = [json.loads(line) for line in result.stderr.splitlines()]
    assert error["event"] == "configuration_error" and error["exit_code"] == 78
    assert_every_problem_listed(error["problems"], bad_file)
    assert "docs/catalog.md" in error["hint"] and "Traceback" not in result.stderr


def test_gunicorn_refuses_a_bad_file_before_forking(bad_file: Path, tmp_path: Path) -> None:
    env = json_log_env(PORT=str(free_port()), MLPA_CATALOG_FILE=str(bad_file), MLPA_STORE="memory", **TEST_SECRETS)
    status, stdout, stderr = run_to_exit(env, tmp_path)
    assert status == 78
    (error,) = [e for e in stdout + stderr if e["event"] == "configuration_error"]
    assert_every_problem_listed(error["problems"], bad_file)
    assert not [e for e in stdout + stderr if str(e["event"]).startswith("Booting worker")]


def test_catalog_check_and_show(bad_file: Path, tmp_path: Path) -> None:
    refused = cli("catalog", "check", str(bad_file))
    assert refused.returncode == 78 and refused.stdout == ""
    assert f"{len(EXPECTED_PROBLEMS)} problems, exit status 78" in refused.stderr
    for expected in EXPECTED_PROBLEMS:
        assert f"  - {bad_file}: {expected}" in refused.stderr
    shipped = cli("catalog", "check", str(REPO_ROOT / "config" / "catalog.toml"))
    assert shipped.returncode == 0 and "15 service types" in shipped.stdout

    # show: the file's catalogue with the variables applied, readable back as a file.
    shown = cli("catalog", "show", USER_FEATURE_BUDGET_AI_RPM_LIMIT="55", MLPA_CAPPED_SERVICE_TYPES="memories")
    assert shown.returncode == 0, shown.stderr
    again = tmp_path / "shown.toml"
    again.write_text(shown.stdout)
    reread = cli("catalog", "check", str(again))
    assert reread.returncode == 0, reread.stderr
    assert 'name = "ai"\npurposes = ["chat"' in shown.stdout
    ai_block = shown.stdout.split('name = "ai"\n', 1)[1].split("[[service_type]]", 1)[0]
    assert "capped = false" in ai_block and "rpm_limit = 55" in ai_block
    bad_variable = cli("catalog", "show", MLPA_CATALOG_FILE=str(bad_file), MLPA_CAPPED_SERVICE_TYPES="gold")
    assert bad_variable.returncode == 78
    assert "MLPA_CAPPED_SERVICE_TYPES: unknown service type 'gold'" in bad_variable.stderr

    for action in ("check", "show"):
        helped = cli("catalog", action, "--help")
        assert helped.returncode == 0 and "exit statuses:" in helped.stdout and "78" in helped.stdout


# -- HUP with open streams ------------------------------------------------------------------

DRAIN_SECONDS = 15
WORKERS = 2
CHAT_PATH = "/v1/chat/completions"
STREAMS = 4
DEEP_ANSWER = ServiceTypeEntry("deep-answer", ("answer",), BudgetTier("end-user-budget-deep-answer", 0.1, 10, 2000, "1d"))


def with_sw_answer() -> Catalog:
    return Catalog((*BUILTIN_CATALOG.service_types, DEEP_ANSWER), BUILTIN_CATALOG.search_types, BUILTIN_CATALOG.models)


@contextlib.asynccontextmanager
async def gunicorn_with_catalog(
    fake_litellm_server, fake_fxa_server, tmp_path: Path, catalog_file: Path, **extra: str
) -> AsyncIterator[Gunicorn]:
    """gunicorn with the catalogue file, every worker ready; stopped (SIGTERM) on the way out."""
    async with gunicorn_on_fakes(
        fake_litellm_server, fake_fxa_server, workers=WORKERS, user="hup-user", log_path=tmp_path / "gunicorn.log",
        metrics_dir=tmp_path, stop_seconds=30,
        # Old workers drain for up to this long after the HUP: longer than any stream here.
        SHUTDOWN_DRAIN_SECONDS=str(DRAIN_SECONDS), MLPA_CATALOG_FILE=str(catalog_file), **extra,
    ) as server:
        await wait_until_live(server)
        yield server


async def chat_status(session: aiohttp.ClientSession, server: Gunicorn, service_type: str, **extra: str) -> int | None:
    """One chat request's status; none when the connection closed under it."""
    try:
        async with session.post(
            f"{server.base_url}{CHAT_PATH}",
            data=json.dumps(chat_body()),
            headers={**server.headers(), "service-type": service_type, **extra},
        ) as response:
            await response.read()
            return response.status
    except aiohttp.ClientConnectionError:
        return None


async def open_streams(server: Gunicorn, count: int) -> tuple[list[aiohttp.ClientSession], list[aiohttp.ClientResponse]]:
    """`count` chat streams, each on its own connection, each past its first event."""
    sessions = [aiohttp.ClientSession() for _ in range(count)]
    responses = [
        await own.post(f"{server.base_url}{CHAT_PATH}", data=json.dumps(chat_body(stream=True)), headers=server.headers())
        for own in sessions
    ]
    for response in responses:
        assert response.status == 200
        assert b"data: " in await response.content.readany()
    return sessions, responses


async def until_served(server: Gunicorn, request: Callable[[], Awaitable[int | None]], status: int, what: str) -> None:
    """Wait until five requests in a row get `status` (old workers may still answer a few)."""
    deadline = time.monotonic() + 20
    in_a_row = 0
    while in_a_row < 5:
        assert time.monotonic() < deadline, f"{what} was never served:\n{server.output()}"
        in_a_row = in_a_row + 1 if await request() == status else 0
        await asyncio.sleep(0.05)


async def until_logged(server: Gunicorn, text: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while server.output().count(text) < count:
        assert server.process.poll() is None, f"gunicorn exited:\n{server.output()}"
        assert time.monotonic() < deadline, f"never {count} times {text!r}:\n{server.output()}"
        await asyncio.sleep(0.05)


async def test_hup_serves_the_new_catalogue_and_cuts_no_open_stream(fake_litellm_server, fake_fxa_server, tmp_path: Path) -> None:
    fake, _ = fake_litellm_server
    catalog_file = tmp_path / "catalog.toml"
    catalog_file.write_text(render_catalog(BUILTIN_CATALOG))
    async with gunicorn_with_catalog(fake_litellm_server, fake_fxa_server, tmp_path, catalog_file) as server:
        # A connection per request: an old worker closes its idle keep-alive connections
        # when it stops, which a client sees as a disconnect to retry, not as an answer.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            assert await chat_status(session, server, "deep-answer") == 422  # not in the catalogue yet

            fake.interval, fake.chunks = 0.1, 40  # about 4 s of stream each
            streams, responses = await open_streams(server, STREAMS)
            try:
                catalog_file.write_text(render_catalog(with_sw_answer()))
                server.process.send_signal(signal.SIGHUP)
                bodies = asyncio.gather(*(asyncio.wait_for(r.content.read(), timeout=DRAIN_SECONDS) for r in responses))

                # New workers take new requests with the new catalogue.
                await until_served(
                    server, lambda: chat_status(session, server, "deep-answer", purpose="answer"), 200, "the new catalogue"
                )
                for body in await bodies:
                    assert body.endswith(DONE), body[-200:]
                    assert b"Server shutting down" not in body
            finally:
                for own in streams:
                    await own.close()
        output = server.output()
        assert "Handling signal: hup" in output, output
        assert output.count("Worker ready") == 2 * WORKERS, output
        for sign in ("Traceback", "WORKER TIMEOUT", "SIGKILL"):
            assert sign not in output, output


async def test_hup_with_a_broken_file_keeps_the_last_good_catalogue(fake_litellm_server, fake_fxa_server, tmp_path: Path) -> None:
    """A broken file on HUP: one ERROR listing every problem, new workers with the last good
    catalogue, no stream cut, the service up; the fixed file is taken on the next HUP."""
    fake, _ = fake_litellm_server
    catalog_file = tmp_path / "catalog.toml"
    catalog_file.write_text(render_catalog(BUILTIN_CATALOG))
    # The master's private snapshot directory is made here, so the test can see it go.
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    async with gunicorn_with_catalog(
        fake_litellm_server, fake_fxa_server, tmp_path, catalog_file, LOG_JSON="true", TMPDIR=str(temp_dir)
    ) as server:
        (snapshot_dir,) = temp_dir.iterdir()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            served = lambda service_type, **extra: chat_status(session, server, service_type, **extra)  # noqa: E731
            fake.interval, fake.chunks = 0.1, 40  # about 4 s of stream each
            streams, responses = await open_streams(server, STREAMS)
            try:
                catalog_file.write_text(BAD_CATALOG)
                server.process.send_signal(signal.SIGHUP)
                bodies = asyncio.gather(*(asyncio.wait_for(r.content.read(), timeout=DRAIN_SECONDS) for r in responses))
                await until_logged(server, "Worker ready", 2 * WORKERS)
                # Only the new workers are left once the old ones have drained their streams.
                for body in await bodies:
                    assert body.endswith(DONE), body[-200:]
                    assert b"Server shutting down" not in body
            finally:
                for own in streams:
                    await own.close()
            await until_logged(server, "Worker exiting", WORKERS)
            # The old catalogue, from the new workers: ai is served, deep-answer still unknown.
            for _ in range(5):
                assert await served("ai") == 200
                assert await served("deep-answer", purpose="answer") == 422
            assert server.process.poll() is None

            events = json_lines(server.output(), "gunicorn")
            (refused,) = [event for event in events if event["event"] == "catalog_file_refused"]
            assert refused["level"] == "error" and "docs/catalog.md" in refused["hint"]
            assert_every_problem_listed(refused["problems"], catalog_file)
            assert not [event for event in events if event["level"] in ("critical", "fatal")], events
            assert "failed to boot" not in server.output()

            # Fixed, with a new type: the next HUP takes it.
            catalog_file.write_text(render_catalog(with_sw_answer()))
            server.process.send_signal(signal.SIGHUP)
            await until_served(server, lambda: served("deep-answer", purpose="answer"), 200, "the fixed catalogue")
            await until_logged(server, "Worker ready", 3 * WORKERS)
            assert server.output().count("catalog_file_refused") == 1

        output = server.output()
        for sign in ("Traceback", "WORKER TIMEOUT", "SIGKILL"):
            assert sign not in output, output
        assert snapshot_dir.is_dir()
    # SIGTERM: the master exits cleanly and removes its snapshot directory.
    assert server.process.returncode == 0, server.output()
    assert list(temp_dir.iterdir()) == [], server.output()
