"""Hostile input gets the documented 4xx, never a 500 (issue 12), over real HTTP.

Four classes, each reproduced on every route it reaches: deeply nested JSON bodies,
non-UTF-8 (obs-text) bytes in credentials, control characters in identifiers (the
Postgres half is in tests/integration/test_hostile_identifiers.py), and malformed HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from mlpa_aiohttp import keys
from mlpa_aiohttp.auth.access_token import issue_access_token
from tests.support.app_attest_device import TestAttestationCA
from tests.support.device_service import ca, google  # noqa: F401 (fixtures)
from tests.support.fake_google import FakeGoogle, make_verdict

from ..conftest import TEST_SECRETS, Service, chat_body, events, tracebacks

BODY_UNPARSEABLE = {"detail": "There was an error parsing the body"}
MASTER = {"master_key": f"Bearer {TEST_SECRETS['MASTER_KEY']}"}

DEEP_ARRAYS = b"[" * 50_000 + b"]" * 50_000
DEEP_OBJECTS = b'{"a":' * 50_000 + b"1" + b"}" * 50_000


@pytest.fixture
async def service(make_service, ca: TestAttestationCA, google: FakeGoogle, tmp_path: Path) -> Service:
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    return await make_service(
        APP_ATTEST_ROOT_CA_PATH=str(root),
        PLAY_INTEGRITY_API_BASE=google.base_url,
        PLAY_INTEGRITY_CREDENTIALS_FILE=str(google.credentials_file),
        MLPA_MOCK_ROUTES="true",
        MOCK_TTFT_MS="0",
        MOCK_STREAMING_CHUNK_LATENCY_MS="0",
    )


def no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not loud, [r.getMessage() for r in loud]
    assert not tracebacks(caplog), "no traceback for a client's mistake"


async def raw_exchange(service: Service, request: bytes) -> bytes:
    """Send bytes as they are (no client library fixing them up); the whole answer."""
    server = service.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
        await writer.wait_closed()


def status_and_json(answer: bytes) -> tuple[int, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body else None


# -- deeply nested JSON ---------------------------------------------------------------------


def json_body_routes(service: Service) -> list[tuple[str, dict[str, str]]]:
    return [
        ("/v1/chat/completions", service.headers()),
        ("/v1/search", service.headers(service_type="search")),
        ("/verify/play", {}),
        ("/user/someone:ai/budget", MASTER),
        ("/mock/chat/completions", service.headers()),
    ]


@pytest.mark.parametrize("body", [DEEP_ARRAYS, DEEP_OBJECTS, b'{"model": "m", "messages": ' + DEEP_ARRAYS + b"}"])
async def test_deeply_nested_json_is_400_on_every_json_route(
    service: Service, caplog: pytest.LogCaptureFixture, body: bytes
) -> None:
    for path, headers in json_body_routes(service):
        response = await service.client.post(path, data=body, headers=headers)
        assert (path, response.status, await response.json()) == (path, 400, BODY_UNPARSEABLE)
    no_error_logged(caplog)


async def test_moderately_nested_json_is_still_accepted(service: Service) -> None:
    nested: Any = "deep"
    for _ in range(60):
        nested = {"type": "object", "properties": {"x": nested}}
    tool = {"type": "function", "function": {"name": "f", "parameters": nested}}
    response = await service.chat(chat_body(tools=[tool]))
    assert response.status == 200, await response.text()


@pytest.mark.parametrize("body", [b'{"a": "\x80"}', b'{"model": "\xc3\x28"}', b'{"max_results": ' + b"9" * 5000 + b"}"])
async def test_undecodable_json_is_400(service: Service, caplog: pytest.LogCaptureFixture, body: bytes) -> None:
    for path, headers in json_body_routes(service):
        response = await service.client.post(path, data=body, headers=headers)
        assert (path, response.status, await response.json()) == (path, 400, BODY_UNPARSEABLE)
    no_error_logged(caplog)


# -- obs-text in Authorization ---------------------------------------------------------------


def raw_post(path: str, headers: dict[str, bytes], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1".encode(), b"Host: test", b"Connection: close", f"Content-Length: {len(body)}".encode()]
    lines += [name.encode() + b": " + value for name, value in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


OBS_TEXT_CREDENTIALS = [b"Bearer \xff\xfe", b"Bearer abc\xe9def", b"\xc3\x28", b"Bearer eyJ\x80.eyJ\x80.sig"]


@pytest.mark.parametrize("credential", OBS_TEXT_CREDENTIALS)
@pytest.mark.parametrize(
    "path,extra,detail",
    [
        ("/v1/chat/completions", {}, "Invalid FxA auth"),
        ("/v1/chat/completions", {"use-app-attest": b"true"}, "Invalid App assert"),
        ("/v1/chat/completions", {"use-play-integrity": b"true"}, "Invalid MLPA access token"),
        ("/v1/search", {}, "Invalid FxA auth"),
        ("/v1/search", {"use-app-attest": b"true"}, "Invalid App assert"),
        ("/v1/search", {"use-play-integrity": b"true"}, "Invalid MLPA access token"),
        ("/mock/chat/completions", {}, "Invalid FxA auth"),
        ("/verify/attest", {}, "Invalid App attest"),
    ],
)
async def test_obs_text_credentials_are_401(
    service: Service, caplog: pytest.LogCaptureFixture, credential: bytes, path: str, extra: dict, detail: str
) -> None:
    body = json.dumps({"query": "q", "max_results": 1} if path == "/v1/search" else chat_body()).encode()
    headers = {"authorization": credential, "service-type": b"search" if path == "/v1/search" else b"ai", **extra}
    status, payload = status_and_json(await raw_exchange(service, raw_post(path, headers, body)))
    assert (status, payload) == (401, {"detail": detail})
    no_error_logged(caplog)


async def test_obs_text_on_the_unauthenticated_mock_route_is_401(service: Service, caplog: pytest.LogCaptureFixture) -> None:
    request = raw_post("/mock/chat/completions_no_auth", {"authorization": b"Bearer a\xff.b.c"}, json.dumps(chat_body()).encode())
    status, payload = status_and_json(await raw_exchange(service, request))
    assert (status, payload) == (401, {"detail": "JWT verification failed: token is not visible ASCII"})
    no_error_logged(caplog)


# -- control characters in identifiers (the memory store half) --------------------------------


@pytest.mark.parametrize("user_id", ["nul\x00id", "line\nbreak", "bell\x07", "c1\x85", "lone\ud800surrogate", "del\x7f"])
async def test_play_user_id_with_control_characters_gets_no_token(
    service: Service, google: FakeGoogle, user_id: str
) -> None:
    google.verdicts["tok"] = make_verdict("any")
    response = await service.client.post("/verify/play", data=json.dumps({"integrity_token": "tok", "user_id": user_id}))
    assert (response.status, await response.json()) == (400, {"detail": "Invalid user_id"})
    assert not google.decode_requests


@pytest.mark.parametrize("sub", ["nul\x00id", "tab\tid", "lone\ud800", "has:colon"])
async def test_access_token_with_a_bad_subject_is_401(service: Service, caplog: pytest.LogCaptureFixture, sub: str) -> None:
    # Tokens issued before identifiers were checked stay valid for a day: they are refused too.
    token = issue_access_token(service.app[keys.SETTINGS].auth.access_token_secret, sub, 3600, time.time())
    response = await service.chat(headers={"authorization": f"Bearer {token}", "service-type": "ai", "use-play-integrity": "1"})
    assert (response.status, await response.json()) == (401, {"detail": "Invalid MLPA access token"})
    assert not service.litellm.requests_to("/customer/new")
    no_error_logged(caplog)


async def test_fxa_uid_with_control_characters_is_401(service: Service) -> None:
    token = service.fxa.issue_jwt("fxa\x00uid")
    response = await service.chat(headers=service.headers(authorization=f"Bearer {token}"))
    assert (response.status, await response.json()) == (401, {"detail": "Invalid FxA auth"})


@pytest.mark.parametrize("action", ["block", "unblock", "budget"])
@pytest.mark.parametrize("user_id", ["nul%00id:ai", "cr%0Did:ai"])
async def test_admin_user_id_with_control_characters_is_404(service: Service, action: str, user_id: str) -> None:
    response = await service.client.post(
        f"/user/{user_id}/{action}", data=json.dumps({"service_type": "ai"}), headers=MASTER
    )
    assert (response.status, await response.json()) == (404, {"detail": "User not found."})


async def test_admin_user_info_with_control_characters_is_404(service: Service) -> None:
    response = await service.client.get("/user/nul%00id:ai", headers=MASTER)
    assert (response.status, await response.json()) == (404, {"detail": "User not found"})


# -- malformed HTTP ----------------------------------------------------------------------------

MALFORMED = {
    "bare_cr": b"GET /health/liveness HTTP/1.1\r\nHost: x\rX-Bad: y\r\n\r\n",
    "length_and_chunked": (
        b"POST /verify/play HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "nul_in_header": b"GET /health/liveness HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_malformed_http_is_400_with_one_warning_and_a_metric(
    service: Service, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    answer = await raw_exchange(service, MALFORMED[name])
    assert answer.split(b" ", 2)[1] == b"400", answer[:200]
    no_error_logged(caplog)
    warnings = events(caplog, "bad_http_request")
    assert len(warnings) == 1 and warnings[0]["level"] == "WARNING", warnings
    counted = service.app[keys.METRICS].registry.get_sample_value(
        "mlpa_bad_http_requests_total", {"reason": warnings[0]["reason"]}
    )
    assert counted == 1


async def test_unprintable_client_text_is_escaped_in_log_lines(service: Service, caplog: pytest.LogCaptureFixture) -> None:
    # The console renderer writes strict UTF-8: a raw surrogate used to end in a
    # "--- Logging error ---" traceback and a lost line.
    body = json.dumps(chat_body(model="bad\u001bmodel")).encode()
    headers = {"authorization": b"Bearer x", "service-type": b"ai", "user-agent": b"Firefox\xff/1"}
    status, payload = status_and_json(await raw_exchange(service, raw_post("/v1/chat/completions", headers, body)))
    assert (status, payload) == (400, {"detail": {"error": 8}})
    line = events(caplog, "request")[-1]
    assert (line["user_agent"], line["model"]) == ("Firefox\\udcff/1", "bad\\x1bmodel")
    assert all(value.isprintable() for value in line.values() if isinstance(value, str))


async def test_non_http_first_line_is_counted_at_debug(service: Service, caplog: pytest.LogCaptureFixture) -> None:
    # A TLS ClientHello on the plain port (or a scanner): aiohttp itself logs it at DEBUG.
    answer = await raw_exchange(service, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n")
    assert answer.split(b" ", 2)[1] == b"400", answer[:200]
    no_error_logged(caplog)
    lines = events(caplog, "bad_http_request")
    assert [(line["level"], line["reason"]) for line in lines] == [("DEBUG", "BadHttpMethod")]
    counted = service.app[keys.METRICS].registry.get_sample_value("mlpa_bad_http_requests_total", {"reason": "BadHttpMethod"})
    assert counted == 1


async def test_a_lone_surrogate_at_any_accepted_depth_is_removed_before_relaying(service: Service) -> None:
    # Escaped in JSON, a lone surrogate is a valid body; UTF-8 cannot carry it upstream.
    nested: Any = "x\ud800y"
    for _ in range(100):
        nested = [nested]
    body = json.dumps(chat_body(messages=[{"role": "user", "content": nested}])).encode()
    response = await service.client.post("/v1/chat/completions", data=body, headers=service.headers())
    assert response.status == 200, await response.text()
    relayed = service.litellm.requests_to("/v1/chat/completions")[-1].json["messages"][0]["content"]
    for _ in range(100):
        relayed = relayed[0]
    assert relayed == "xy"
