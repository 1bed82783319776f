"""Arbitrary bytes, percent-encoded, in every path parameter and query value (over a raw
socket): invalid UTF-8, encoded surrogates, NUL, `..`. A documented 4xx (or a 200 / 404
where the value is simply not found), never a 5xx, never an ERROR line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from ..conftest import TEST_SECRETS
from .conftest import fuzz_settings
from .live_service import LiveService

MASTER = b"master_key: Bearer " + TEST_SECRETS["MASTER_KEY"].encode()
BUDGET_BODY = json.dumps({"service_type": "ai"}).encode()

# (method, template with one {} for the fuzzed value, headers, body)
TARGETS = {
    "user_info": ("GET", "/user/{}", [MASTER], b""),
    "block": ("POST", "/user/{}/block", [MASTER], b""),
    "unblock": ("POST", "/user/{}/unblock", [MASTER], b""),
    "budget": ("POST", "/user/{}/budget", [MASTER], BUDGET_BODY),
    "list_limit": ("GET", "/user?limit={}", [MASTER], b""),
    "list_offset": ("GET", "/user?offset={}", [MASTER], b""),
    "challenge": ("GET", "/verify/challenge?key_id_b64={}", [], b""),
    "docs_static": ("GET", "/api/docs/static/{}", [], b""),
    "unmatched": ("GET", "/{}", [], b""),
}

values = st.binary(max_size=40) | st.sampled_from(
    [b"\x00", b"\xff", b"\xed\xa0\x80", b"..", b"../../etc/passwd", b"a:ai", b"%", b" ", b"\xc0\xaf"]
)


def percent_encoded(value: bytes, *, every_byte: bool) -> bytes:
    if every_byte:
        return b"".join(b"%%%02X" % byte for byte in value)
    return b"".join(bytes([byte]) if 0x21 <= byte < 0x7F and byte not in b"%?#/" else b"%%%02X" % byte for byte in value)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_any_encoded_path_or_query_value_gets_a_documented_answer(live: LiveService, no_new_errors: None, name: str) -> None:
    method, template, headers, body = TARGETS[name]

    @fuzz_settings(40)
    @given(value=values, every_byte=st.booleans())
    def exchange(value: bytes, every_byte: bool) -> None:
        target = template.encode().replace(b"{}", percent_encoded(value, every_byte=every_byte))
        lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: fuzz", b"Connection: close", *headers]
        lines.append(b"Content-Length: " + str(len(body)).encode())
        answer = live.raw_request(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        status = int(answer.split(b" ", 2)[1])
        assert status < 500, answer[:400]

    exchange()
