"""Arbitrary bytes in every credential header, on every auth path, over a raw socket (no
client library to tidy them up): obs-text, NUL, CR, controls. The answer is aiohttp's 400
for what HTTP itself forbids, else the path's documented 401 / 422; never a 5xx, never an
ERROR line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from ..conftest import chat_body
from .conftest import fuzz_settings
from .live_service import LiveService

CHAT = json.dumps(chat_body()).encode()
SEARCH = json.dumps({"query": "q", "max_results": 1}).encode()

# (path, body, fixed headers, the header the fuzzed bytes go into, statuses documented for it)
AUTH_PATHS = {
    "fxa": ("/v1/chat/completions", CHAT, {"service-type": b"ai"}, "authorization", {401, 422}),
    "dev": ("/v1/chat/completions", CHAT, {"service-type": b"ai-dev", "authorization": b"Bearer x"}, "x-dev-authorization", {401}),
    "app_attest": ("/v1/chat/completions", CHAT, {"service-type": b"ai", "use-app-attest": b"1"}, "authorization", {401, 422}),
    "play": ("/v1/search", SEARCH, {"use-play-integrity": b"true"}, "authorization", {401, 422}),
    "attest": ("/verify/attest", b"", {}, "authorization", {401, 422}),
    "mock_no_auth": ("/mock/chat/completions_no_auth", CHAT, {}, "authorization", {401}),
    "master_key": ("/user", b"", {}, "master_key", {401}),
    "ui_key": ("/user/counts-by-service-type", b"", {}, "mlpa-ui-access-key", {401}),
    "service_type": ("/v1/chat/completions", CHAT, {"authorization": b"Bearer x"}, "service-type", {400, 401, 422}),
    "purpose": ("/v1/chat/completions", CHAT, {"authorization": b"Bearer x", "service-type": b"ai"}, "purpose", {400, 401}),
    # Logged, not authenticating: the answer is the FxA path's 401 whatever they hold.
    "user_agent": ("/v1/chat/completions", CHAT, {"authorization": b"Bearer x", "service-type": b"ai"}, "user-agent", {401}),
    "session_id": ("/v1/search", SEARCH, {"authorization": b"Bearer x"}, "session-id", {401}),
    "request_id": ("/v1/search", SEARCH, {"authorization": b"Bearer x"}, "x-request-id", {401}),
}

header_bytes = st.binary(max_size=60) | st.builds(
    lambda prefix, body: prefix + body,
    st.sampled_from([b"Bearer ", b"", b"Bearer eyJhbGciOiJIUzI1NiJ9."]),
    st.binary(max_size=40).map(lambda b: bytes(c | 0x80 for c in b)),  # pure obs-text
)


def request_bytes(path: str, body: bytes, headers: dict[str, bytes]) -> bytes:
    method = b"GET" if path.startswith("/user") else b"POST"
    lines = [method + b" " + path.encode() + b" HTTP/1.1", b"Host: fuzz", b"Connection: close"]
    if method == b"POST":
        lines.append(b"Content-Length: " + str(len(body)).encode())
    lines += [name.encode() + b": " + value for name, value in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body if method == b"POST" else b"")


@pytest.mark.parametrize("name", sorted(AUTH_PATHS))
def test_arbitrary_header_bytes_get_a_documented_4xx(live: LiveService, no_new_errors: None, name: str) -> None:
    path, body, fixed, fuzzed, documented = AUTH_PATHS[name]

    @fuzz_settings(60)
    @given(value=header_bytes)
    def exchange(value: bytes) -> None:
        answer = live.raw_request(request_bytes(path, body, {**fixed, fuzzed: value}))
        status = int(answer.split(b" ", 2)[1])
        if status == 400 and b"text/plain" in answer.partition(b"\r\n\r\n")[0]:
            return  # aiohttp's parser refused what HTTP forbids (a CR, LF, NUL...)
        assert status in documented | {200} if name in ("service_type", "purpose") else status in documented, answer[:300]
        json.loads(answer.partition(b"\r\n\r\n")[2])

    exchange()


request_lines = st.lists(st.binary(max_size=30), max_size=6)


@fuzz_settings(150)
@given(
    start=st.sampled_from([b"GET /health/liveness HTTP/1.1", b"POST /verify/play HTTP/1.1", b"POST /v1/chat/completions HTTP/1.1"]),
    lines=request_lines,
    body=st.binary(max_size=40),
)
def test_garbage_requests_never_make_the_server_log_an_error(
    live: LiveService, no_new_errors: None, start: bytes, lines: list[bytes], body: bytes
) -> None:
    """Whole requests of arbitrary header lines and body, the input then closed: whatever
    aiohttp or the routes answer, it is not a 5xx and nothing is logged as an ERROR."""
    request = b"\r\n".join([start, b"Host: fuzz", *lines]) + b"\r\n\r\n" + body
    answer = live.raw_request(request, end_input=True)
    if answer:
        assert int(answer.split(b" ", 2)[1]) < 500, answer[:300]
