"""`wire._loads` is `json.loads` for every body: the same value, or the same error at the same
position. Its shorter way covers bodies that are one object with nothing around it; the
properties below generate those, their near misses (whitespace, trailing data, NUL bytes,
other encodings, broken UTF-8, surrogates) and arbitrary bytes."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mlpa_aiohttp.wire import _loads

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        value = decode(raw)
    except json.JSONDecodeError as exc:
        return "JSONDecodeError", (exc.msg, exc.pos)
    except Exception as exc:  # the type is the contract: UnicodeDecodeError, ValueError, RecursionError
        return type(exc).__name__, None
    # NaN is not equal to itself; compare its text instead.
    return "value", json.dumps(value, sort_keys=True) if _has_nan(value) else value


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False


def same_as_json_loads(raw: bytes) -> None:
    assert outcome(_loads, raw) == outcome(json.loads, raw)


@given(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), st.sampled_from(["", " ", "\n", "\t\r\n ", "x", "{}", "]"]),
       st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32", "utf-8-sig"]), st.booleans())
@settings(max_examples=400)
def test_objects_and_their_near_misses_decode_as_json_loads_does(
    value: dict[str, Any], suffix: str, encoding: str, ensure_ascii: bool
) -> None:
    text = json.dumps(value, ensure_ascii=ensure_ascii)
    for candidate in (text, text + suffix, suffix + text, text[:-1], text.replace(":", "", 1)):
        same_as_json_loads(candidate.encode(encoding, errors="surrogatepass"))


@given(st.binary(max_size=40))
@example(b"{")
@example(b"{\x00")
@example(b'{\x00"\x00')
@example(b'{"a":"\xed\xa0\x80"}')  # an encoded lone surrogate: surrogatepass lets it through
@example(b'{"a":"\xff"}')  # not UTF-8
@example(b'{"a":NaN}')
@example(b'{"a":1' + b"0" * 5000 + b"}")  # past the int digit limit
@example(b"{" * 3000)
def test_any_bytes_decode_as_json_loads_does(raw: bytes) -> None:
    same_as_json_loads(raw)


@given(st.binary(max_size=40))
def test_bytes_after_an_opening_brace_decode_as_json_loads_does(tail: bytes) -> None:
    same_as_json_loads(b"{" + tail)
