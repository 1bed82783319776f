"""MLPA_ADMIN_PORT (compatibility.md D59, mlpa_aiohttp/routes/admin_port.py): one app on two
real loopback listeners. The public port answers the operators' paths with the 404 of an
unknown path, the admin port serves them and refuses the clients' routes; the health routes
answer on both. Unset, /metrics and the rest stay on the one port (the reference).
The gunicorn and `serve` entries are run in tests/e2e/test_admin_port.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.routes.admin_port import is_admin_path
from mlpa_aiohttp.settings import Settings
from tests.support.processes import free_port

from ..conftest import TEST_SECRETS, chat_body, make_settings

NOT_FOUND = {"detail": "Not Found"}
UI_KEY = {"mlpa-ui-access-key": f"Bearer {TEST_SECRETS['MLPA_UI_ACCESS_KEY']}"}
# Each of the operators' surfaces, as a GET that the admin port answers with 200.
OPERATOR_GETS = [
    ("/metrics", {}),
    ("/openapi.json", {}),
    ("/api/docs", {}),
    ("/api/docs/static/swagger-ui.css", {}),
    ("/admin", {}),
    ("/user/signup-cap-status", UI_KEY),
]


@dataclass
class TwoPorts:
    public: str
    admin: str
    token: str

    def client_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}", "service-type": "ai", "content-type": "application/json"}


async def serve(settings: Settings, ports: list[int]) -> web.AppRunner:
    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


@pytest.fixture
async def two_ports(fake_litellm_server, fake_fxa_server) -> AsyncIterator[TwoPorts]:
    (_, litellm_server), (fxa, fxa_server) = fake_litellm_server, fake_fxa_server
    public, admin = free_port(), free_port()
    while admin == public:
        admin = free_port()
    settings = make_settings(
        str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")),
        PORT=str(public), MLPA_ADMIN_PORT=str(admin),
    )
    runner = await serve(settings, [public, admin])
    try:
        yield TwoPorts(f"http://127.0.0.1:{public}", f"http://127.0.0.1:{admin}", fxa.issue_jwt("admin-port-user"))
    finally:
        await runner.cleanup()


async def status_and_body(session: aiohttp.ClientSession, method: str, url: str, **kwargs) -> tuple[int, bytes]:
    async with session.request(method, url, **kwargs) as response:
        return response.status, await response.read()


@pytest.mark.parametrize(("path", "headers"), OPERATOR_GETS)
async def test_the_public_port_refuses_and_the_admin_port_serves_the_operators_routes(
    two_ports: TwoPorts, path: str, headers: dict[str, str]
) -> None:
    async with aiohttp.ClientSession() as session:
        status, body = await status_and_body(session, "GET", two_ports.public + path, headers=headers)
        assert (status, json.loads(body)) == (404, NOT_FOUND)
        status, body = await status_and_body(session, "GET", two_ports.admin + path, headers=headers)
        assert status == 200, body[:300]


async def test_the_public_404_is_that_of_an_unknown_path_whatever_the_method(two_ports: TwoPorts) -> None:
    async with aiohttp.ClientSession() as session:
        unknown = await status_and_body(session, "GET", two_ports.public + "/no-such-path")
        # A wrong method does not give a 405 (which would tell the route exists), nor does a
        # path below an operator's prefix that no route has, nor a failed admin key.
        for method, path in [("POST", "/metrics"), ("DELETE", "/openapi.json"), ("GET", "/user/someone/budget"),
                             ("POST", "/user/someone/block"), ("GET", "/admin/"), ("GET", "/user")]:
            assert await status_and_body(session, method, two_ports.public + path) == unknown, (method, path)
        # The admin port itself still checks the keys: a listener is not an authorisation.
        status, _ = await status_and_body(session, "GET", two_ports.admin + "/user/signup-cap-status")
        assert status == 401


async def test_the_metrics_of_the_admin_port_are_the_services(two_ports: TwoPorts) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            two_ports.public + "/v1/chat/completions", data=json.dumps(chat_body(stream=True)),
            headers=two_ports.client_headers(),
        ) as response:
            assert response.status == 200
            assert (await response.read()).endswith(b"data: [DONE]\n\n")
        status, body = await status_and_body(session, "GET", two_ports.admin + "/metrics")
    assert status == 200
    text = body.decode()
    assert 'mlpa_requests_total{endpoint="/v1/chat/completions"' in text


async def test_the_clients_routes_are_on_the_public_port_only(two_ports: TwoPorts) -> None:
    async with aiohttp.ClientSession() as session:
        body = json.dumps(chat_body())
        status, answer = await status_and_body(
            session, "POST", two_ports.admin + "/v1/chat/completions", data=body, headers=two_ports.client_headers()
        )
        assert (status, json.loads(answer)) == (404, NOT_FOUND)
        for path in ("/v1/usage", "/verify/challenge"):
            status, _ = await status_and_body(session, "GET", two_ports.admin + path, headers=two_ports.client_headers())
            assert status == 404, path
        status, _ = await status_and_body(
            session, "POST", two_ports.public + "/v1/chat/completions", data=body, headers=two_ports.client_headers()
        )
        assert status == 200


@pytest.mark.parametrize("path", ["/health/liveness", "/health/readiness"])
async def test_the_health_routes_answer_on_both_ports(two_ports: TwoPorts, path: str) -> None:
    async with aiohttp.ClientSession() as session:
        for base in (two_ports.public, two_ports.admin):
            status, _ = await status_and_body(session, "GET", base + path)
            assert status == 200, (base, path)


async def test_unset_everything_stays_on_the_one_port(fake_litellm_server, fake_fxa_server) -> None:
    (_, litellm_server), (_, fxa_server) = fake_litellm_server, fake_fxa_server
    port = free_port()
    settings = make_settings(str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")), PORT=str(port))
    assert settings.server.admin_port is None
    runner = await serve(settings, [port])
    try:
        async with aiohttp.ClientSession() as session:
            for path, headers in OPERATOR_GETS:
                status, _ = await status_and_body(session, "GET", f"http://127.0.0.1:{port}{path}", headers=headers)
                assert status == 200, path
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("path", "admin"),
    [
        ("/metrics", True), ("/metrics/", True), ("/admin", True), ("/admin/", True), ("/user", True),
        ("/user/abc/budget", True), ("/api/docs", True), ("/api/docs/static/x.js", True), ("/openapi.json", True),
        ("/metricsx", False), ("/users", False), ("/administrator", False), ("/api", False),
        ("/v1/chat/completions", False), ("/health/liveness", False), ("/", False),
    ],
)
def test_which_paths_are_the_operators(path: str, admin: bool) -> None:
    assert is_admin_path(path) is admin


@pytest.mark.parametrize(
    ("env", "expected", "problem"),
    [
        ({}, None, None),
        ({"MLPA_ADMIN_PORT": ""}, None, None),
        ({"MLPA_ADMIN_PORT": "9090"}, 9090, None),
        ({"MLPA_ADMIN_PORT": "8080"}, None, "MLPA_ADMIN_PORT: must differ from PORT (8080), got 8080"),
        ({"MLPA_ADMIN_PORT": "9000", "PORT": "9000"}, None, "MLPA_ADMIN_PORT: must differ from PORT (9000), got 9000"),
        ({"MLPA_ADMIN_PORT": "0"}, None, "MLPA_ADMIN_PORT: must be a port number from 1 to 65535, got 0"),
        ({"MLPA_ADMIN_PORT": "65536"}, None, "MLPA_ADMIN_PORT: must be a port number from 1 to 65535, got 65536"),
        ({"MLPA_ADMIN_PORT": "nine"}, None, "MLPA_ADMIN_PORT: expected a port number, got 'nine'"),
    ],
)
def test_the_setting(env: dict[str, str], expected: int | None, problem: str | None) -> None:
    reading = Settings.read_environ({**TEST_SECRETS, **env})
    assert reading.settings.server.admin_port == expected
    assert list(reading.problems) == ([problem] if problem else [])


async def raw_status(base: str, target: str) -> int:
    """The status of a GET whose request target is sent exactly as given (no client-side
    normalisation of dots, slashes or escapes)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(status_line.split()[1])


@pytest.mark.parametrize(
    "target",
    ["/./metrics", "/x/../metrics", "/user/../metrics", "/%6Detrics", "//metrics", "/metrics?x=1",
     "/api/docs/static/../../openapi.json", "/admin/../openapi.json", "/%2Fmetrics"],
)
async def test_spellings_of_an_operators_path_are_refused_on_the_public_port(two_ports: TwoPorts, target: str) -> None:
    assert await raw_status(two_ports.public, target) == 404
