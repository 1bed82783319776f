"""The start-up check of LiteLLM (upstream/reachability.py) against real loopback sockets:
quiet when something listens, the cause in a few words when not, the URL without its
credentials."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from mlpa_aiohttp.settings import UpstreamSettings
from mlpa_aiohttp.upstream.reachability import connection_failure_cause, litellm_unreachable_cause, shown_url
from tests.support.processes import free_port


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


async def test_a_listening_litellm_is_reachable(listening_port: int) -> None:
    assert await litellm_unreachable_cause(UpstreamSettings(api_base=f"http://127.0.0.1:{listening_port}")) is None


async def test_a_closed_port_is_connection_refused() -> None:
    settings = UpstreamSettings(api_base=f"http://127.0.0.1:{free_port()}")
    assert await litellm_unreachable_cause(settings) == "connection refused"


def test_causes_in_a_few_words() -> None:
    assert connection_failure_cause(TimeoutError(), 10.0) == "no answer within 10 s"
    assert connection_failure_cause(socket.gaierror(-2, "Name or service not known"), 10.0) == (
        "name not resolved (Name or service not known)"
    )
    assert connection_failure_cause(ConnectionResetError(104, "reset"), 1.0) == "connection reset by peer"


def test_the_logged_url_carries_no_credentials() -> None:
    assert shown_url("https://user:hunter2@litellm.internal:4000") == "https://litellm.internal:4000"
    assert shown_url("http://127.0.0.1:4000") == "http://127.0.0.1:4000"
