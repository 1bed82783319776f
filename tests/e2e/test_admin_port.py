"""MLPA_ADMIN_PORT under the two real entries (compatibility.md D59): gunicorn with the shipped
config/gunicorn.conf.py and two workers, and `python -m mlpa_aiohttp serve`. Each listens on
both ports; over real HTTP the public port refuses /metrics and the admin surface with a 404
and relays streams, the admin port serves the operators' routes (the scrape aggregating
both workers) and refuses the clients'. A taken admin port stops either entry with one line
naming MLPA_ADMIN_PORT and exit status 71."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp.process.startup import EXIT_CANNOT_LISTEN, EXIT_CONFIG
from tests.support.gunicorn import (
    GUNICORN,
    Gunicorn,
    gunicorn_on_fakes,
    wait_until_live,
)
from tests.support.processes import REPO_ROOT, free_port, running_demo, stop_process
from tests.support.tiers import require_slow_tier

from ..conftest import TEST_SECRETS, chat_body

WORKERS = 2
CHAT_PATH = "/v1/chat/completions"
NOT_FOUND = {"detail": "Not Found"}
OPERATOR_PATHS = ("/metrics", "/openapi.json", "/api/docs", "/admin")


def other_free_port(*taken: int) -> int:
    port = free_port()
    while port in taken:
        port = free_port()
    return port


@pytest.fixture
async def gunicorn_two_ports(fake_litellm_server, fake_fxa_server, tmp_path: Path) -> AsyncIterator[tuple[Gunicorn, str]]:
    admin_port = free_port()
    metrics_dir = tmp_path / "prometheus"
    async with gunicorn_on_fakes(
        fake_litellm_server, fake_fxa_server, workers=WORKERS, user="admin-port-user", log_path=tmp_path / "gunicorn.log",
        metrics_dir=metrics_dir, stop_seconds=15,
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), SHUTDOWN_DRAIN_SECONDS="1", MLPA_ADMIN_PORT=str(admin_port),
    ) as server:
        assert not server.base_url.endswith(f":{admin_port}")
        yield server, f"http://127.0.0.1:{admin_port}"


async def get(session: aiohttp.ClientSession, url: str, **kwargs) -> tuple[int, bytes]:
    async with session.get(url, **kwargs) as response:
        return response.status, await response.read()


async def test_gunicorn_serves_the_operators_routes_on_the_admin_port_only(gunicorn_two_ports) -> None:
    server, admin = gunicorn_two_ports
    await wait_until_live(server)
    async with aiohttp.ClientSession() as session:
        for path in OPERATOR_PATHS:
            status, body = await get(session, server.base_url + path)
            assert (status, json.loads(body)) == (404, NOT_FOUND), path
            status, body = await get(session, admin + path)
            assert status == 200, (path, body[:200])
        # Streams on the public port, as many as there are workers so each is likely used.
        for _ in range(2 * WORKERS):
            async with session.post(
                server.base_url + CHAT_PATH, data=json.dumps(chat_body(stream=True)), headers=server.headers()
            ) as response:
                assert response.status == 200
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
        async with session.post(
            admin + CHAT_PATH, data=json.dumps(chat_body(stream=True)), headers=server.headers()
        ) as response:
            assert (response.status, await response.json()) == (404, NOT_FOUND)
        # The kubelet's probes stay on the public port; the admin port answers them too.
        for base in (server.base_url, admin):
            assert (await get(session, base + "/health/liveness"))[0] == 200
        status, body = await get(session, admin + "/metrics")
    assert status == 200
    # The scrape of the admin port is the multiprocess sum over both workers: the streams and
    # the admin port's refusal (counted, as every 404, under the route it names).
    chat_requests = sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "mlpa_requests_total" and sample.labels.get("endpoint") == CHAT_PATH
    )
    assert chat_requests == 2 * WORKERS + 1


@pytest.fixture
def serve_two_ports(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    require_slow_tier("starts `python -m mlpa_aiohttp serve`")
    port = free_port()
    admin_port = other_free_port(port)
    log_path = tmp_path / "serve.log"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
        **TEST_SECRETS,
        "MLPA_STORE": "memory",
        "LITELLM_API_BASE": "http://127.0.0.1:9",
        "MLPA_ADMIN_PORT": str(admin_port),
        "LOG_JSON": "true",
    }
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
        try:
            yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", log_path
        finally:
            stop_process(process, 15)
    assert process.returncode == 0, log_path.read_text()


async def test_serve_serves_the_operators_routes_on_the_admin_port_only(serve_two_ports) -> None:
    public, admin, log_path = serve_two_ports
    deadline = time.monotonic() + 20
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                if (await get(session, public + "/health/liveness"))[0] == 200:
                    break
            except aiohttp.ClientConnectionError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            await asyncio.sleep(0.05)
        for path in OPERATOR_PATHS:
            status, body = await get(session, public + path)
            assert (status, json.loads(body)) == (404, NOT_FOUND), path
            status, _ = await get(session, admin + path)
            assert status == 200, path
        status, body = await get(session, admin + "/v1/usage")
        assert (status, json.loads(body)) == (404, NOT_FOUND)
    [listening] = [
        event for event in map(json.loads, log_path.read_text().splitlines()) if event["event"] == "serve_listening"
    ]
    assert (listening["address"], listening["admin_address"]) == (public[7:], admin[7:])


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_serve_refuses_a_taken_admin_port_with_one_line(busy_port: int) -> None:
    port = other_free_port(busy_port)
    done = subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1", "--port", str(port)],
        check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
        env={**os.environ, "MLPA_DEBUG": "true", "MLPA_STORE": "memory", "MLPA_ADMIN_PORT": str(busy_port)},
    )
    assert done.returncode == EXIT_CANNOT_LISTEN, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert f"port {busy_port} on 127.0.0.1 is already in use" in line and "MLPA_ADMIN_PORT" in line


def test_gunicorn_refuses_a_taken_admin_port_with_one_line(busy_port: int) -> None:
    require_slow_tier("starts gunicorn")
    env = {
        **{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
        **TEST_SECRETS, "PYTHONPATH": str(REPO_ROOT), "MLPA_STORE": "memory", "LOG_JSON": "false",
        "PORT": str(other_free_port(busy_port)), "MLPA_ADMIN_PORT": str(busy_port),
    }
    done = subprocess.run(GUNICORN, check=False, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == EXIT_CANNOT_LISTEN, done.stdout + done.stderr
    (message,) = done.stderr.splitlines()
    assert f"port {busy_port} on 0.0.0.0 is already in use" in message and "MLPA_ADMIN_PORT" in message


def test_serve_refuses_an_admin_port_equal_to_its_port() -> None:
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "serve", "--host", "127.0.0.1", "--port", str(port)],
        check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
        env={**os.environ, "MLPA_DEBUG": "true", "MLPA_STORE": "memory", "MLPA_ADMIN_PORT": str(port)},
    )
    assert done.returncode == EXIT_CONFIG, done.stdout + done.stderr
    assert f"MLPA_ADMIN_PORT: must differ from --port ({port}), got {port}" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_demo_keeps_everything_on_its_one_port() -> None:
    """The demo's banner names /metrics and /admin on its port, whatever MLPA_ADMIN_PORT says."""
    with running_demo({**os.environ, "MLPA_ADMIN_PORT": str(free_port())}) as (process, port):
        ready = process.stdout.readline()
        assert f"http://127.0.0.1:{port}" in ready, ready
        async with aiohttp.ClientSession() as session:
            for path in ("/metrics", "/admin"):
                assert (await get(session, f"http://127.0.0.1:{port}{path}"))[0] == 200, path
