"""The real LiteLLM proxy as the service's upstream.

One LiteLLM per test session (it takes ~10-30 s to start), on loopback, no database, its
models pointing at `FakeProvider`; the service runs as `python -m mlpa_aiohttp serve` (and
once under gunicorn) against it. The provider and a fake FxA run in a thread of their own
with their own event loop, so session-scoped processes can use them across tests.

LiteLLM is looked up as `MLPA_LITELLM_BIN`, else `<repo>/.venv-litellm/bin/litellm` (made by
.ci/run with setup.cfg's `real-litellm` pin), else `litellm` beside this Python. Where it is not
installed or does not start, the suite skips with one line.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from tests.support.fake_provider import Behaviour, FakeProvider
from tests.support.processes import stop_process

from ..conftest import TEST_SECRETS
from .litellm_process import MODEL_GROUPS, NOT_INSTALLED, REPO_ROOT, RealLiteLLM, launch_litellm, litellm_executable

MASTER_KEY = TEST_SECRETS["MASTER_KEY"]  # LiteLLM without a database knows only its master key
START_TIMEOUT = 120.0
PROVIDER_TIMEOUT = 1.0  # LiteLLM's timeout for the provider: the slow model exceeds it
T = TypeVar("T")

# LiteLLM model group -> the provider behaviour its deployment asks for.
SUITE_MODEL_GROUPS: dict[str, Behaviour] = {**MODEL_GROUPS, "trickle-model": Behaviour.TRICKLE}
PRICE_PER_TOKEN = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LoopThread:
    """An event loop in a daemon thread, serving aiohttp apps for the whole session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="real-litellm-fakes", daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []

    def call(self, coroutine: Awaitable[T], timeout: float = 10.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)  # type: ignore[arg-type]
        return future.result(timeout)

    def serve(self, app: web.Application) -> str:
        async def start() -> str:
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._runners.append(runner)
            return f"http://127.0.0.1:{runner.addresses[0][1]}"

        return self.call(start())

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@dataclass
class Fakes:
    provider: FakeProvider
    provider_url: str
    fxa: FakeFxA
    fxa_url: str


@dataclass
class Service:
    process: subprocess.Popen
    base_url: str
    log_path: Path
    fxa: FakeFxA

    def headers(self, user: str = "real-litellm-user", **extra: str) -> dict[str, str]:
        return {
            "authorization": f"Bearer {self.fxa.issue_jwt(user)}",
            "service-type": "ai",
            "content-type": "application/json",
            **extra,
        }

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def litellm_config(provider_url: str) -> dict[str, Any]:
    deployments = [
        {
            "model_name": group,
            "litellm_params": {
                "model": f"openai/{behaviour.value}",
                "api_base": f"{provider_url}/v1",
                "api_key": "fake-provider-key",
                "timeout": PROVIDER_TIMEOUT,
                "max_retries": 0,
            },
        }
        for group, behaviour in SUITE_MODEL_GROUPS.items()
    ]
    for deployment in deployments:
        if deployment["model_name"] == "priced-model":
            deployment["model_info"] = {
                "input_cost_per_token": PRICE_PER_TOKEN,
                "output_cost_per_token": PRICE_PER_TOKEN,
            }
    return {
        "model_list": deployments,
        # LiteLLM retries a failed call twice with backoff by default (~22 s for a 429):
        # the service's answers are what is tested here, so no retries.
        "litellm_settings": {
            "num_retries": 0,
            "request_timeout": 30,
            "callbacks": "litellm_hooks.over_budget",
        },
        "router_settings": {"num_retries": 0, "retry_after": 0, "allowed_fails": 1000},
        "general_settings": {"master_key": MASTER_KEY},
        "search_tools": [
            {
                "search_tool_name": "exa-search",
                "litellm_params": {"search_provider": "exa_ai", "api_key": "fake-exa-key", "api_base": provider_url},
            }
        ],
    }


def wait_for_http(url: str, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    return False


def warm_up(server: RealLiteLLM) -> None:
    """One completion first: LiteLLM's first call takes seconds (imports, clients), which
    would otherwise land in whichever test comes first."""
    request = urllib.request.Request(
        f"{server.base_url}/v1/chat/completions",
        data=b'{"model": "ok-model", "messages": [{"role": "user", "content": "warm up"}]}',
        headers={"authorization": f"Bearer {MASTER_KEY}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, response.read()


# Package scope, like everything here: LiteLLM, its in-process fakes and the service stop
# with these tests (LiteLLM's background calls must not land in a later test's process).
@pytest.fixture(scope="package")
def fakes() -> Iterator[Fakes]:
    thread = LoopThread()
    provider = FakeProvider(slow_seconds=PROVIDER_TIMEOUT + 2.0)
    fxa = FakeFxA()
    try:
        yield Fakes(provider, thread.serve(provider.make_app()), fxa, thread.serve(fxa.make_app()))
    finally:
        thread.close()


@pytest.fixture(scope="package")
def real_litellm(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealLiteLLM]:
    executable = litellm_executable()
    if executable is None:
        pytest.skip(NOT_INSTALLED)
    started = time.monotonic()
    server = launch_litellm(executable, litellm_config(fakes.provider_url), tmp_path_factory.mktemp("litellm"), free_port())
    process = server.process
    try:
        if not wait_for_http(f"{server.base_url}/health/liveliness", process, START_TIMEOUT):
            last = (server.log_tail(1) or "no output").strip()
            code = process.poll()
            why = f"exited with {code}" if code is not None else f"not up within {START_TIMEOUT:.0f} s"
            pytest.skip(f"real LiteLLM did not start ({why}): {last}")
        server.started_in = time.monotonic() - started
        warm_up(server)
        yield server
    finally:
        stop_process(process)


def service_env(litellm: RealLiteLLM, fakes: Fakes, port: int, **extra: str) -> dict[str, str]:
    return {
        **{key: value for key, value in os.environ.items() if key != "PROMETHEUS_MULTIPROC_DIR"},
        **TEST_SECRETS,
        # Without a database LiteLLM accepts only its master key for completions too.
        "MLPA_VIRTUAL_KEY": MASTER_KEY,
        "PYTHONPATH": str(REPO_ROOT),
        "PORT": str(port),
        "MLPA_STORE": "memory",
        "LITELLM_API_BASE": litellm.base_url,
        "FXA_BASE_URL": f"{fakes.fxa_url}/v1",
        "LOG_LEVEL": "INFO",
        **extra,
    }


def start_service(command: list[str], env: dict[str, str], log_path: Path, fakes: Fakes) -> Service:
    log_file = log_path.open("wb")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    log_file.close()  # the child holds its own descriptor
    service = Service(process, f"http://127.0.0.1:{env['PORT']}", log_path, fakes.fxa)
    if not wait_for_http(f"{service.base_url}/health/liveness", process, 30.0):
        stop_process(process)
        raise AssertionError(f"the service did not start:\n{service.log()[-3000:]}")
    return service


@pytest.fixture(scope="package")
def served(real_litellm: RealLiteLLM, fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`python -m mlpa_aiohttp serve` against the real LiteLLM, for all the tests here."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    service = start_service(
        [sys.executable, "-m", "mlpa_aiohttp", "serve"], service_env(real_litellm, fakes, port), log_path, fakes
    )
    try:
        yield service
    finally:
        stop_process(service.process)
