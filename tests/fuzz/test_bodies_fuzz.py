"""Chat and search bodies of arbitrary content, relayed for real: valid credentials, so
the values travel the whole way (parsing, re-encoding for LiteLLM, the fake LiteLLM, the
answer). Lone surrogates, controls, deep nesting, huge numbers: a 200 or a documented 4xx,
never a 5xx from the service."""

from __future__ import annotations

import json
from typing import Any

import requests
from hypothesis import given, strategies as st

from mlpa_aiohttp.wire import MAX_JSON_DEPTH

from .conftest import fuzz_settings
from .live_service import LiveService

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=20) | st.sampled_from(
    ["\ud800", "a\udfffb", "\x00", "\u001b[0m", "\u2028"]
)
# Depths near the limits that matter: the reference's sanitising depth, the body limit.
depths = st.sampled_from([0, 1, 31, 32, 33, 34, 64, MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 1]) | st.integers(
    0, MAX_JSON_DEPTH + 3
)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | any_text
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3), max_leaves=12)


def wrapped(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


@fuzz_settings(60)
@given(content=values, depth=depths, stream=st.booleans())
def test_chat_content_of_any_shape_is_relayed_or_refused_with_a_4xx(
    live: LiveService, no_new_errors: None, content: Any, depth: int, stream: bool
) -> None:
    body = {"model": "gpt-oss-120b", "stream": stream, "messages": [{"role": "user", "content": wrapped(content, depth)}]}
    headers = {"authorization": f"Bearer {live.fxa_token()}", "service-type": "ai", "content-type": "application/json"}
    response = requests.post(live.base_url + "/v1/chat/completions", data=json.dumps(body), headers=headers, timeout=30)
    assert response.status_code < 500, response.text[:300]
    if response.status_code == 200 and stream:
        assert response.content.rstrip().endswith(b"data: [DONE]")


@fuzz_settings(60)
@given(query=any_text, max_results=st.integers(-5, 15) | st.just(10**40))
def test_search_queries_of_any_text_are_relayed_or_refused_with_a_4xx(
    live: LiveService, no_new_errors: None, query: str, max_results: int
) -> None:
    headers = {"authorization": f"Bearer {live.fxa_token()}", "content-type": "application/json"}
    body = json.dumps({"query": query, "max_results": max_results})
    response = requests.post(live.base_url + "/v1/search", data=body, headers=headers, timeout=30)
    assert response.status_code < 500, response.text[:300]
