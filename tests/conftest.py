"""Shared fixtures: the service under test wired to loopback fakes of LiteLLM and FxA."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import rsa

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.observability.logging import configure_logging
from mlpa_aiohttp.settings import RedisSettings, Settings
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from tests.support import aiohttp_trial, depth
from tests.support.redis_server import RedisBinaryMissing, ThrowawayRedis
from tests.support.tiers import slow_markers

DEV_TOKEN = "test-dev-token"
TEST_KEYS = {
    "MASTER_KEY": "sk-test-master",
    "MLPA_VIRTUAL_KEY": "sk-test-virtual",
    "MLPA_UI_ACCESS_KEY": "sk-test-ui",
    "MLPA_ACCESS_TOKEN_SECRET": "test-access-token-secret-of-32-bytes-or-more",
    "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": DEV_TOKEN,
}
# Not secrets, but refused like them outside MLPA_DEBUG when missing (compatibility.md D63).
TEST_PLATFORMS = {
    "APP_DEVELOPMENT_TEAM": "TESTTEAM01",
    "APP_ATTEST_BUNDLE_IDS": "*",
    "PLAY_INTEGRITY_CREDENTIALS_FILE": str(Path(__file__).parent / "data" / "google-credentials-never-used.json"),
}
# Everything production start-up asks for: the secrets, and what iOS and Android clients need.
TEST_SECRETS = {**TEST_KEYS, **TEST_PLATFORMS}


@pytest.fixture(scope="session", autouse=True)
def _structured_logging() -> None:
    # Route structlog through stdlib logging so `caplog` sees every event as a dict.
    configure_logging(level="DEBUG", json=True)


def events(caplog: pytest.LogCaptureFixture, name: str | None = None) -> list[dict[str, Any]]:
    """Structured log events captured so far (optionally only those named `name`)."""
    found = []
    for record in caplog.records:
        if isinstance(record.msg, dict):
            event = {**record.msg, "level": record.levelname}
            if name is None or event.get("event") == name:
                found.append(event)
    return found


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Records that carry a traceback: a stdlib record's own `exc_info`, or one of ours whose
    structlog event dict still holds `exc_info` (rendered only by the formatter, so the
    record's attribute alone never shows it)."""
    return [
        record
        for record in caplog.records
        if record.exc_info or (isinstance(record.msg, dict) and record.msg.get("exc_info"))
    ]


@dataclass
class Service:
    """The app under test, its client, and the fakes it talks to."""

    client: TestClient
    litellm: FakeLiteLLM
    fxa: FakeFxA
    app: web.Application
    token: str = ""
    base_headers: dict[str, str] = field(default_factory=dict)

    def headers(self, **extra: str) -> dict[str, str]:
        merged = {"authorization": f"Bearer {self.token}", "service-type": "ai", **self.base_headers}
        merged.update({k.replace("_", "-"): v for k, v in extra.items()})
        return merged

    async def chat(self, body: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None, **kw: Any):
        payload = body if body is not None else chat_body()
        return await self.client.post(
            "/v1/chat/completions", data=json.dumps(payload), headers=headers or self.headers(), **kw
        )


def chat_body(*, stream: bool = False, scenario: str | None = None, **fields: Any) -> dict[str, Any]:
    content = "Hello" if scenario is None else f"Hello [fake:{scenario}]"
    body: dict[str, Any] = {
        "model": "gpt-oss-120b",
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    }
    body.update(fields)
    return body


def make_settings(litellm_url: str, fxa_url: str, **env: str) -> Settings:
    environ = {
        **TEST_SECRETS,
        "LITELLM_API_BASE": litellm_url,
        "FXA_BASE_URL": fxa_url,
        "MLPA_STORE": "memory",
        **env,
    }
    return Settings.from_environ(environ)


@pytest.fixture
async def fake_litellm_server(aiohttp_server) -> AsyncIterator[tuple[FakeLiteLLM, TestServer]]:
    fake = FakeLiteLLM(virtual_key=TEST_SECRETS["MLPA_VIRTUAL_KEY"], master_key=TEST_SECRETS["MASTER_KEY"])
    server = await aiohttp_server(fake.make_app())
    yield fake, server


@pytest.fixture(scope="session")
def fxa_signing_key() -> rsa.RSAPrivateKey:
    """The RSA key every test's fake FxA signs with (each under its own key id): making a
    2048-bit key costs about 45 ms of CPU, a third of the quick tier's when each test made its own."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="session")
def google_service_account_key() -> rsa.RSAPrivateKey:
    """The service account key of every test's fake Google (for the same reason)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
async def fake_fxa_server(aiohttp_server, fxa_signing_key: rsa.RSAPrivateKey) -> AsyncIterator[tuple[FakeFxA, TestServer]]:
    fake = FakeFxA(first_key=fxa_signing_key)
    server = await aiohttp_server(fake.make_app())
    yield fake, server


ServiceFactory = Callable[..., Awaitable[Service]]


@pytest.fixture
async def make_service(aiohttp_client, fake_litellm_server, fake_fxa_server) -> ServiceFactory:
    litellm, litellm_server = fake_litellm_server
    fxa, fxa_server = fake_fxa_server

    async def build(**env: str) -> Service:
        settings = make_settings(str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")), **env)
        app = create_app(settings)
        client = await aiohttp_client(app)
        return Service(client=client, litellm=litellm, fxa=fxa, app=app, token=fxa.issue_jwt("test-uid"))

    return build


@pytest.fixture
async def service(make_service: ServiceFactory) -> Service:
    return await make_service()


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Every test must leave no task of ours pending once its fixtures are torn down."""
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert not leaked, f"tasks left pending: {leaked}"


def open_streams(service: Service) -> int:
    """Streams being relayed, as the `mlpa_open_streams` gauge says (the relay's tracker
    registers a stream and counts it in the same place)."""
    value = service.app[keys.METRICS].registry.get_sample_value("mlpa_open_streams")
    return int(value or 0)


def pytest_configure(config: pytest.Config) -> None:
    depth.choose_profile(config)
    aiohttp_trial.open_fence_if_asked()


def pytest_report_header(config: pytest.Config) -> str:
    return depth.describe()


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown when it is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `-n` with `--dist loadscope` (setup.cfg's default), the slow tier runs on one
    worker (tests/support/scheduling.py); another `--dist` is xdist's own."""
    if config.getoption("dist") != "loadscope":
        return None
    from tests.support.scheduling import SlowTierOnOneWorker

    return SlowTierOnOneWorker(config, log)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ThrowawayRedis]:
    """The session's real Redis (tests/support/redis_server.py). Tests that stop, restart or
    pause it leave it running again for the next (`redis_settings`)."""
    try:
        server = ThrowawayRedis()
    except RedisBinaryMissing as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:  # every Redis test errors with this one line, not a traceback each
        pytest.fail(missing, pytrace=False)
    with server:
        yield server


@pytest.fixture
def redis_settings(redis_server: ThrowawayRedis) -> RedisSettings:
    """Settings of the session's Redis, running and empty."""
    if not redis_server.is_running():
        redis_server.start()
    redis_server.flush()
    return redis_server.settings()


# A test's figures (a load run's peaks and bounds) as a user property: it travels with the test's
# report from pytest-xdist's workers, and `pytest_terminal_summary` prints it after the run.
FIGURES = "figures"


@pytest.fixture
def report_figures(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """`report_figures(text)`: printed in the run's summary under "figures", whatever `-q`,
    `-n` or the capture mode."""

    def report(text: str) -> None:
        record_property(FIGURES, text)

    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    found = [
        (report.nodeid, value)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == FIGURES
    ]
    if found:
        terminalreporter.section("figures")
        for nodeid, text in found:
            terminalreporter.write_line(f"{nodeid}:")
            terminalreporter.write_line(str(text).strip())


# The session's real servers: (the fixture that starts it, the marker its tests carry, its name).
SESSION_SERVERS = (("pg_server", "postgres", "PostgreSQL"), ("redis_server", "redis", "Redis"))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers (tests/support/tiers.py): a test gets `slow` and the marker of what it needs
    from where it lives. A test that reaches the session's PostgreSQL or Redis must say so
    itself: `-m "not postgres"` and `-m "not redis"` rely on it. The image test runs only when `-m` names `image`."""
    for item in items:
        for name in slow_markers(item.nodeid.split("::", 1)[0]):
            item.add_marker(name)
    for fixture, marker, server in SESSION_SERVERS:
        unmarked = [
            item.nodeid
            for item in items
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None
        ]
        if unmarked:
            raise pytest.UsageError(
                f"these tests use {server} but lack @pytest.mark.{marker}:\n  " + "\n  ".join(unmarked)
            )
    if "image" not in (config.getoption("markexpr", default="") or ""):
        image = [item for item in items if item.get_closest_marker("image") is not None]
        if image:
            config.hook.pytest_deselected(items=image)
            items[:] = [item for item in items if item.get_closest_marker("image") is None]


logging.getLogger("asyncio").setLevel(logging.WARNING)
