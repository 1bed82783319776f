"""The SSE accountant's totals must not depend on where the network split the stream:
real LiteLLM streams (the captures in tests/data) and synthetic ones with usage and tool
calls, cut at random points, give the same totals as one whole read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from mlpa_aiohttp.relay.sse import StreamAccountant
from tests.real_litellm.captures import captures_dir

from .conftest import fuzz_settings

CAPTURES = captures_dir()
REAL_STREAMS = sorted(CAPTURES.glob("*.sse"))
if not REAL_STREAMS:  # an error, not an empty parameter set that pytest would skip
    raise FileNotFoundError(f"no captured LiteLLM streams (*.sse) in {CAPTURES}")


def totals(reads: list[bytes]) -> tuple[int, int, bool, tuple[str, ...]]:
    accountant = StreamAccountant()
    for read in reads:
        accountant.feed(read)
    return accountant.prompt_tokens, accountant.completion_tokens, accountant.usage_seen, accountant.tool_names_in_order()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("capture", REAL_STREAMS, ids=lambda p: p.name)
def test_real_stream_totals_do_not_depend_on_read_boundaries(capture: Path) -> None:
    data = capture.read_bytes()
    whole = totals([data])
    if capture.name == "stream_ok.sse":  # the one capture with an include_usage chunk
        assert whole[2] and whole[0] > 0 and whole[1] > 0, whole
    reads_file = capture.with_suffix(".reads.json")
    if reads_file.exists():  # the reads as the capture received them
        sizes = [read["n"] for read in json.loads(reads_file.read_text())]
        offsets = [sum(sizes[:i]) for i in range(1, len(sizes))]
        assert totals(split(data, offsets)) == whole

    @fuzz_settings(150)
    @given(st.lists(st.integers(0, len(data)), max_size=40))
    def cut(cuts: list[int]) -> None:
        assert totals(split(data, cuts)) == whole

    cut()
    assert totals([bytes([b]) for b in data]) == whole  # every byte its own read


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


synthetic_streams = st.builds(
    lambda names, prompt, completion, with_usage: (
        b"".join(
            event({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"name": n, "arguments": "{}"}}]}}]})
            + event({"choices": [{"index": 0, "delta": {"content": "text \\n\\n with breaks"}}], "usage": None})
            for i, n in enumerate(names)
        )
        + (event({"choices": [{"index": 0, "delta": {}}], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}) if with_usage else b"")
        + b"data: [DONE]\n\n",
        (prompt if with_usage else 0, completion if with_usage else 0, with_usage, tuple(names)),
    ),
    st.lists(st.text("abcdefgh_", min_size=1, max_size=12), max_size=4),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.booleans(),
)


@fuzz_settings(200)
@given(synthetic_streams, st.lists(st.integers(0, 10_000), max_size=30))
def test_synthetic_stream_totals_do_not_depend_on_read_boundaries(stream: tuple[bytes, tuple], cuts: list[int]) -> None:
    data, expected = stream
    assert totals([data]) == expected
    assert totals(split(data, cuts)) == expected
