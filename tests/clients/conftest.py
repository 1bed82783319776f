"""The service as each real client meets it: over real HTTP, in every matrix cell (both relays,
keep-alive off and on for the client's service type), with the fakes of the outside services
the clients' own attestation flows need (a test App Attest CA, a fake Google)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import quote

import pytest
from yarl import URL

from tests.conftest import TEST_SECRETS, Service, ServiceFactory
from tests.support.app_attest_device import TestAttestationCA
from tests.support.device_service import google  # noqa: F401 (fixture)
from tests.support.fake_google import FakeGoogle

TEAM = "TESTTEAM01"  # an Apple-shaped team id; TEAMID1234, the reference default, is refused outside debug
IOS_BUNDLE = "org.mozilla.ios.Firefox"
KEEPALIVE_SECONDS = "0.05"
# With keep-alive on, LiteLLM takes this long to its first token, so keep-alive bytes go out.
KEEPALIVE_TTFT_SECONDS = 0.15

# Every error the reference (1.0.39) sends, and success; each client's test says what its user sees.
CASES = (
    "success",
    "budget_exceeded",
    "rate_limited",
    "provider_throttling",
    "context_too_large",
    "request_too_large",
    "blocked_user",
    "signup_cap_reached",
    "bad_model",
    "bad_credentials",
    "expired_credentials",
    "server_shutdown",
    "upstream_cut",
    "upstream_error_event",
    "global_budget_exceeded",
)
# case -> the fake LiteLLM scenario the user's text asks for
SCENARIOS = {
    "budget_exceeded": "budget_422",
    "rate_limited": "rate_limit_429",
    "provider_throttling": "provider_rate_limit_429",
    "context_too_large": "context_window_400",
    "bad_model": "invalid_model_400",
    "server_shutdown": "hang_after_headers",
    "upstream_cut": "mid_stream_error",
    "upstream_error_event": "mid_stream_error_event",
    # MLPA 1.0.39's code 10: LiteLLM's own budget for the shared key is spent.
    "global_budget_exceeded": "global_budget_400",
}
REQUEST_SIZE_LIMIT = 4096


@dataclass(frozen=True)
class Cell:
    fast_path: bool
    keepalive: bool

    @property
    def id(self) -> str:
        return f"{'fast' if self.fast_path else 'regular'}-relay-keepalive-{'on' if self.keepalive else 'off'}"


CELLS = tuple(Cell(fast_path, keepalive) for fast_path in (False, True) for keepalive in (False, True))


def case_text(case: str) -> str:
    scenario = SCENARIOS.get(case)
    text = "A page about foxes." if scenario is None else f"A page about foxes. [fake:{scenario}]"
    if case == "request_too_large":
        text += " fox" * REQUEST_SIZE_LIMIT
    return text


def case_env(case: str, service_type: str) -> dict[str, str]:
    if case == "signup_cap_reached":
        return {"MLPA_ENFORCE_SIGNIN_CAP": "true", "MLPA_MAX_SIGNED_IN_USERS": "0", "MLPA_CAPPED_SERVICE_TYPES": service_type}
    if case == "request_too_large":
        return {"MAX_REQUEST_SIZE_BYTES": str(REQUEST_SIZE_LIMIT)}
    if case == "server_shutdown":
        return {"SHUTDOWN_DRAIN_SECONDS": "0.1"}
    return {}


@pytest.fixture(scope="session")
def attestation_ca() -> TestAttestationCA:
    return TestAttestationCA()


ClientServiceFactory = Callable[..., Awaitable[Service]]


@pytest.fixture
def client_service(
    make_service: ServiceFactory, google: FakeGoogle, attestation_ca: TestAttestationCA, tmp_path: Path
) -> ClientServiceFactory:
    """The service for one matrix cell and one case, with the public settings only."""
    root = tmp_path / "app-attest-root.pem"
    root.write_bytes(attestation_ca.root_pem)

    async def build(cell: Cell, case: str, service_type: str, **extra_env: str) -> Service:
        env = {
            "RELAY_FAST_PATH": "true" if cell.fast_path else "false",
            "APP_ATTEST_ROOT_CA_PATH": str(root),
            "APP_DEVELOPMENT_TEAM": TEAM,
            "PLAY_INTEGRITY_API_BASE": str(google.base_url),
            "PLAY_INTEGRITY_CREDENTIALS_FILE": str(google.credentials_file),
            **case_env(case, service_type),
            **extra_env,
        }
        if cell.keepalive:
            env.update({"STREAM_KEEPALIVE_SECONDS": KEEPALIVE_SECONDS, "STREAM_KEEPALIVE_SERVICE_TYPES": service_type})
        service = await make_service(**env)
        service.litellm.ttft = KEEPALIVE_TTFT_SECONDS if cell.keepalive else 0.0
        return service

    return build


def base_url(service: Service) -> str:
    return str(service.client.make_url("")).rstrip("/")


async def block_user(service: Service, user_id: str) -> None:
    """What an operator does: the admin route, with the master key."""
    # An App Attest identity is base64: its `/` travels percent-encoded in the path.
    path = URL(f"/user/{quote(user_id, safe='')}/block", encoded=True)
    response = await service.client.post(path, headers={"master_key": f"Bearer {TEST_SECRETS['MASTER_KEY']}"})
    assert response.status == 200, await response.text()


T = TypeVar("T")


async def during_shutdown(service: Service, ask: Awaitable[T]) -> T:
    """Start `ask`, wait until LiteLLM holds its request, shut the service down, and return
    what the client made of it."""
    task = asyncio.ensure_future(ask)
    deadline = time.monotonic() + 10
    while not service.litellm.requests_to("/v1/chat/completions"):
        assert time.monotonic() < deadline, "the request never reached LiteLLM"
        if task.done():
            return task.result()
        await asyncio.sleep(0.01)
    await service.app.shutdown()
    return await asyncio.wait_for(task, 10)


# A request LiteLLM answers with headers and then nothing: the stream stays open until its
# client gives up.
HOLD_TEXT = "Keep this open [fake:hang_after_headers]"


async def while_one_stream_is_held(service: Service, hold: Awaitable[Any], second: Awaitable[T]) -> T:
    """Start `hold` (a client's stream that stays open), wait until LiteLLM has its request,
    then return what `second` got; the first client gives up afterwards."""
    held = asyncio.ensure_future(hold)
    deadline = time.monotonic() + 10
    while not service.litellm.requests_to("/v1/chat/completions"):
        assert time.monotonic() < deadline and not held.done()
        await asyncio.sleep(0.01)
    try:
        return await second
    finally:
        held.cancel()  # the first client gives up: its stream ends
        await asyncio.gather(held, return_exceptions=True)


def cell_params() -> Any:
    return pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
