"""The production entry (gunicorn with config/gunicorn.conf.py) as a child process, for the
end-to-end tests: its command and environment, waiting for its workers, stopping it, and
reading its JSON lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import TEST_SECRETS
from tests.support.processes import REPO_ROOT, free_port, stop_process
from tests.support.tiers import require_slow_tier

GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"]


@dataclass
class Gunicorn:
    process: subprocess.Popen
    base_url: str
    metrics_dir: Path
    log_path: Path
    token: str
    workers: int

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}", "service-type": "ai", "content-type": "application/json"}


def service_env(litellm_url: str, fxa_url: str, *, port: int, workers: int, **extra: str) -> dict[str, str]:
    """The environment of a gunicorn serving the memory store against the given fakes."""
    return {
        **{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
        **TEST_SECRETS,
        "PYTHONPATH": str(REPO_ROOT),
        "PORT": str(port),
        "GUNICORN_WORKERS": str(workers),
        "MLPA_STORE": "memory",
        "LITELLM_API_BASE": litellm_url,
        "FXA_BASE_URL": fxa_url,
        "LOG_LEVEL": "INFO",
        **extra,
    }


@contextlib.asynccontextmanager
async def running_gunicorn(
    env: dict[str, str], *, port: int, log_path: Path, metrics_dir: Path, token: str, stop_seconds: float
) -> AsyncIterator[Gunicorn]:
    """gunicorn started with `env`, its output in `log_path`; on the way out SIGTERM, and
    SIGKILL after `stop_seconds`."""
    require_slow_tier("starts gunicorn")
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(GUNICORN, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        server = Gunicorn(process, f"http://127.0.0.1:{port}", metrics_dir, log_path, token, int(env["GUNICORN_WORKERS"]))
        try:
            yield server
        finally:
            stop_process(process, stop_seconds)


@contextlib.asynccontextmanager
async def gunicorn_on_fakes(
    fake_litellm_server: Any, fake_fxa_server: Any, *, workers: int, user: str, log_path: Path, metrics_dir: Path,
    stop_seconds: float, **extra: str,
) -> AsyncIterator[Gunicorn]:
    """gunicorn on a free port against the test fakes (the fixtures of the same names), with
    `extra` in its environment and a token the fake FxA issued for `user`."""
    (_, litellm_server), (fxa, fxa_server) = fake_litellm_server, fake_fxa_server
    port = free_port()
    env = service_env(
        str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")), port=port, workers=workers, **extra
    )
    async with running_gunicorn(
        env, port=port, log_path=log_path, metrics_dir=metrics_dir, token=fxa.issue_jwt(user), stop_seconds=stop_seconds
    ) as server:
        yield server


async def wait_until_live(server: Gunicorn, timeout: float = 20.0) -> int:
    """Wait until every worker has its signal handlers (gunicorn's `post_worker_init`
    line), then poll liveness until a worker answers."""
    deadline = time.monotonic() + timeout
    while server.output().count("Worker ready") < server.workers:
        assert server.process.poll() is None, f"gunicorn exited early:\n{server.output()}"
        assert time.monotonic() < deadline, f"gunicorn workers did not get ready:\n{server.output()}"
        await asyncio.sleep(0.05)
    async with aiohttp.ClientSession() as session:
        while True:
            assert server.process.poll() is None, f"gunicorn exited early:\n{server.output()}"
            try:
                async with session.get(f"{server.base_url}/health/liveness") as response:
                    if response.status == 200:
                        return 1
            except aiohttp.ClientConnectionError:
                pass
            assert time.monotonic() < deadline, f"gunicorn did not start:\n{server.output()}"
            await asyncio.sleep(0.1)


def json_log_env(**extra: str) -> dict[str, str]:
    """One worker writing JSON lines; the secrets and the store are the caller's to give."""
    known = set(TEST_SECRETS) | {"PROMETHEUS_MULTIPROC_DIR", "MLPA_STORE", "LOG_JSON", "PORT"}
    return {
        **{k: v for k, v in os.environ.items() if k not in known},
        "PYTHONPATH": str(REPO_ROOT),
        "LOG_JSON": "true",
        "LOG_LEVEL": "INFO",
        "GUNICORN_WORKERS": "1",
        "SHUTDOWN_DRAIN_SECONDS": "1",
        **extra,
    }


def json_lines(text: str, stream: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            pytest.fail(f"a {stream} line is not JSON: {line!r}\n--- {stream}:\n{text}")
        assert isinstance(event, dict), line
        events.append(event)
    return events


def run_to_exit(env: dict[str, str], tmp_path: Path, timeout: float = 30) -> tuple[int, list[dict], list[dict]]:
    """gunicorn run until it exits by itself: its status and its stdout and stderr lines."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.run(GUNICORN, cwd=REPO_ROOT, env=env, stdout=stdout, stderr=stderr, timeout=timeout)
    return (
        process.returncode,
        json_lines(out.read_text(errors="replace"), "stdout"),
        json_lines(err.read_text(errors="replace"), "stderr"),
    )
