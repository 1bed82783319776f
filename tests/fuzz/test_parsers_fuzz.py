"""Hypothesis on the parsers where request bytes become values: JSON bodies of
pathological shape, the chat / search / Play request models, and every credential
reader with arbitrary text (obs-text surrogates and controls included). Each must answer
with a value or its own documented error, never anything else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, strategies as st

from mlpa_aiohttp.auth.access_token import AccessTokenInvalid, verify_access_token
from mlpa_aiohttp.auth.dispatch import bearer_token
from mlpa_aiohttp.auth.envelope import ASSERTION_CLAIMS, Base64Invalid, EnvelopeInvalid, decode_base64, decode_envelope
from mlpa_aiohttp.auth.play import _parse_play_request
from mlpa_aiohttp.errors import ApiError, RequestInvalid
from mlpa_aiohttp.models import ChatBody, parse_chat, parse_search
from mlpa_aiohttp.wire import (
    MAX_JSON_DEPTH,
    BodyUnparseable,
    JsonSyntaxError,
    decode_json,
    is_base_identity,
    is_credential_text,
    is_identifier,
)

from .conftest import fuzz_settings

SECRET = "fuzz-secret-long-enough-for-hs256-000000"

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30
)
# Header values as aiohttp hands them over: latin-1-ish text, obs-text bytes that were not
# UTF-8 arrive as lone surrogates (surrogateescape), plus whatever else Python allows.
header_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["Bearer \udcff\udcfe", "Bearer a\x00b", "Bearer eyJ\udc80.x.y", "", "Bearer ", "true", "yes", "ai", "search"]
)


def nested(depth: int, kinds: list[str]) -> bytes:
    opening = "".join('{"k":' if kinds[i % len(kinds)] == "o" else "[" for i in range(depth))
    closing = "".join("}" if kinds[i % len(kinds)] == "o" else "]" for i in reversed(range(depth)))
    return (opening + "0" + closing).encode()


@fuzz_settings(150)
@given(st.integers(0, 60_000), st.lists(st.sampled_from("ao"), min_size=1, max_size=5))
def test_nesting_depth_is_accepted_up_to_the_limit_and_refused_beyond(depth: int, kinds: list[str]) -> None:
    raw = nested(depth, kinds)
    chat = b'{"model": "m", "messages": [' + raw + b"]}"
    headers = {"authorization": "Bearer t", "service-type": "ai"}
    if depth + 2 <= MAX_JSON_DEPTH:
        assert decode_json(raw) == json.loads(raw)
        assert parse_chat(chat, headers)[1].fields["messages"] == [json.loads(raw)]
    elif depth > MAX_JSON_DEPTH:
        with pytest.raises(BodyUnparseable):
            decode_json(raw)
    for parse in (parse_chat, parse_search):
        try:
            parse(chat, headers)
        except ApiError as error:
            assert_documented(error)


@fuzz_settings(300)
@given(st.binary(max_size=300) | st.builds(lambda v: json.dumps(v).encode(), json_values))
def test_any_bytes_are_a_value_or_a_documented_refusal(raw: bytes) -> None:
    try:
        decode_json(raw)
    except (JsonSyntaxError, BodyUnparseable):
        pass


@fuzz_settings(100)
@given(st.text("0123456789", min_size=1, max_size=12_000), st.sampled_from(["", "-", "0.", "1e"]))
def test_huge_numbers_are_values_or_400(digits: str, prefix: str) -> None:
    raw = f'{{"max_results": {prefix}{digits}}}'.encode()
    try:
        value = decode_json(raw)
    except JsonSyntaxError:
        assert prefix in ("", "-") and digits.startswith("0") and len(digits) > 1  # leading zeros are not JSON
    except BodyUnparseable:
        assert len(digits) > 4000  # the interpreter's integer digit limit
    else:
        assert isinstance(value["max_results"], (int, float))


@fuzz_settings(100)
@given(st.lists(st.tuples(st.sampled_from(["model", "stream", "query"]), json_scalars), min_size=2, max_size=6))
def test_duplicate_keys_last_one_wins(pairs: list[tuple[str, Any]]) -> None:
    raw = ("{" + ",".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}").encode()
    expected = {}
    for key, value in pairs:
        expected[key] = value
    assert decode_json(raw) == json.loads(json.dumps(expected))


def assert_documented(error: ApiError) -> None:
    assert error.status in (400, 422), error
    json.dumps(error.body())  # the error body can always be sent
    if isinstance(error, RequestInvalid):
        assert error.detail and all(set(item) == {"loc", "msg", "type"} for item in error.detail)


@fuzz_settings(300)
@given(
    json_values | st.dictionaries(st.sampled_from(sorted(ChatBody.model_fields)), json_values, max_size=8),
    st.dictionaries(
        st.sampled_from(["authorization", "service-type", "purpose", "use-app-attest", "use-play-integrity", "use-qa-certificates", "x-dev-authorization"]),
        header_text,
    ),
)
def test_chat_and_search_models_answer_a_value_or_a_4xx(body: Any, headers: dict[str, str]) -> None:
    raw = json.dumps(body).encode()
    for parse in (parse_chat, parse_search):
        try:
            proxy_headers, request = parse(raw, headers)
        except ApiError as error:
            assert_documented(error)
        else:
            assert isinstance(proxy_headers.authorization, str)
            if parse is parse_chat:
                assert isinstance(request.model, str)
                for name, value in request.fields.items():
                    assert value is not None and name in ChatBody.model_fields
            else:
                assert isinstance(request.query, str) and 1 <= request.max_results <= 10


@fuzz_settings(200)
@given(json_values | st.fixed_dictionaries({}, optional={"integrity_token": json_values, "user_id": json_values}))
def test_play_request_model_answers_a_value_or_a_4xx(body: Any) -> None:
    try:
        token, user_id, package = _parse_play_request(json.dumps(body).encode(), "org.mozilla.firefox")
    except ApiError as error:
        assert_documented(error)
    else:
        assert all(isinstance(v, str) for v in (token, user_id, package))


@fuzz_settings(400)
@given(header_text)
def test_credential_readers_refuse_only_with_their_own_errors(value: str) -> None:
    bearer_token(value)
    with pytest.raises(EnvelopeInvalid):
        decode_envelope(value, ASSERTION_CLAIMS)
    with pytest.raises(AccessTokenInvalid):
        verify_access_token(SECRET, bearer_token(value))
    try:
        decode_base64(value)
    except Base64Invalid:
        pass
    if not is_credential_text(value):
        assert any(ord(c) > 126 or ord(c) < 32 for c in value)


@fuzz_settings(400)
@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=30))
def test_an_identifier_is_always_storable_and_printable(value: str) -> None:
    if is_identifier(value):
        value.encode("utf-8")  # PostgreSQL text: UTF-8, no surrogates
        assert "\x00" not in value and not any(c in value for c in "\r\n\t\x1b\x7f\x85")
    if is_base_identity(value):
        assert ":" not in value and is_identifier(value)
