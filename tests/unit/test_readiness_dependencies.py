"""A LiteLLM outage over real HTTP (compatibility.md D64): the fake LiteLLM's server is stopped,
then started again on the same port. By default readiness keeps answering 200 (status
"degraded", LiteLLM "unreachable", mlpa_dependency_up 0), so the pod stays in the Service and a
chat request gets the service's own 502 body, which Firefox clients handle; with
READINESS_REQUIRES_DEPENDENCIES=true readiness is 503, as the reference's, and a load balancer
would take every pod out at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from mlpa_aiohttp import keys
from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from tests.support.processes import free_port

from ..conftest import TEST_SECRETS, Service, chat_body, make_settings


class StoppableLiteLLM:
    """The fake LiteLLM on a fixed loopback port, which the test stops and starts."""

    def __init__(self) -> None:
        self.fake = FakeLiteLLM(virtual_key=TEST_SECRETS["MLPA_VIRTUAL_KEY"], master_key=TEST_SECRETS["MASTER_KEY"])
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.fake.make_app())
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
        self._runner = None


@pytest.fixture
async def litellm() -> AsyncIterator[StoppableLiteLLM]:
    server = StoppableLiteLLM()
    await server.start()
    yield server
    if server._runner is not None:
        await server.stop()


async def start_service(aiohttp_client: Any, aiohttp_server: Any, litellm: StoppableLiteLLM, fxa_key: Any,
                        **env: str) -> Service:
    fxa = FakeFxA(first_key=fxa_key)
    fxa_server = await aiohttp_server(fxa.make_app())
    settings = make_settings(litellm.url, str(fxa_server.make_url("/v1")), UPSTREAM_RETRY_ATTEMPTS="0", **env)
    app = create_app(settings)
    client = await aiohttp_client(app)
    return Service(client=client, litellm=litellm.fake, fxa=fxa, app=app, token=fxa.issue_jwt("outage-uid"))


def litellm_up(service: Service) -> float | None:
    return service.app[keys.METRICS].registry.get_sample_value("mlpa_dependency_up", {"dependency": "litellm"})


async def readiness(service: Service) -> tuple[int, dict[str, Any]]:
    response = await service.client.get("/health/readiness")
    return response.status, await response.json()


@pytest.mark.parametrize(
    ("env", "status_during_outage"),
    [({}, 200), ({"READINESS_REQUIRES_DEPENDENCIES": "true"}, 503)],
    ids=["own-health", "requires-dependencies"],
)
async def test_a_stopped_litellm_and_what_clients_get(
    aiohttp_client: Any, aiohttp_server: Any, fxa_signing_key: Any, litellm: StoppableLiteLLM,
    env: dict[str, str], status_during_outage: int,
) -> None:
    service = await start_service(aiohttp_client, aiohttp_server, litellm, fxa_signing_key, **env)
    assert (await service.chat(chat_body(stream=True))).status == 200  # the user exists from here on
    status, body = await readiness(service)
    assert (status, body["status"], litellm_up(service)) == (200, "connected", 1.0)

    await litellm.stop()
    status, body = await readiness(service)
    assert status == status_during_outage
    assert body["status"] == "degraded" and body["litellm"]["status"] == "unreachable"
    assert litellm_up(service) == 0.0
    # What a client gets from this pod meanwhile: the service's own error, in the reference's
    # shapes, for a stream and for a plain completion alike.
    streamed = await service.chat(chat_body(stream=True))
    assert streamed.status == 200  # a stream's status goes out before LiteLLM is asked
    assert await streamed.read() == b'data: {"code": 502, "error": "Upstream service returned an error"}\n\n'
    plain = await service.chat(chat_body())
    assert (plain.status, await plain.json()) == (502, {"detail": {"error": "Failed to proxy request"}})

    await litellm.start()
    status, body = await readiness(service)
    assert (status, body["status"], litellm_up(service)) == (200, "connected", 1.0)
    assert (await service.chat(chat_body(stream=True))).status == 200
