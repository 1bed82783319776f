"""The committed captures (tests/data/litellm-1.106.12) are what the pinned LiteLLM answers
today: `capture.py` regenerates them into a temporary folder, and each file must equal its
committed version once these, and only these, are normalised in both (they change from one
run to the next with nothing changed in LiteLLM's answers):

- time measured: `# elapsed_s`, `x-litellm-response-duration-ms`,
  `x-litellm-overhead-duration-ms`, and the slow model's "time taken=3.01 seconds";
- the clock: `date`, `llm_provider-date`, and `"created":` in bodies;
- ids made fresh per call: UUIDs (`x-litellm-call-id`, a mock completion's id);
- the fake provider's port (`127.0.0.1:<port>`) and `x-litellm-model-id`, a hash of the
  deployment's parameters, which include that port;
- `llm_provider-server`: the Python and aiohttp versions the fake provider runs on;
- `content-length`, after checking it against its own file's body (a body changes length
  only where it prints a measured time);
- `.reads.json`: how a stream's bytes came in socket reads, and when, is up to scheduling;
  each must account for exactly its `.sse` file's bytes.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from .capture import capture, capture_files
from .captures import COMMITTED
from .litellm_process import NOT_INSTALLED, litellm_executable

if litellm_executable() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

VARYING_HEADERS = {
    "date", "llm_provider-date", "x-litellm-response-duration-ms", "x-litellm-overhead-duration-ms",
    "x-litellm-model-id", "llm_provider-server",
}  # fmt: skip
VARYING_IN_TEXT = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r'"created":\d+'), '"created":<clock>'),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"time taken=[\d.]+ seconds"), "time taken=<measured> seconds"),
]


def normalised(path: Path) -> str:
    text = path.read_bytes().decode()
    if path.suffix == ".http":
        head, _, body = text.partition("\n\n")
        lines = []
        for line in head.split("\n"):
            key, separator, value = line.partition(": ")
            if key.lower() == "content-length":
                assert int(value) == len(body.encode()), f"{path}: content-length {value}, body of {len(body.encode())}"
                value = "<body's length>"
            elif key == "# elapsed_s" or key.lower() in VARYING_HEADERS:
                value = "<varies>"
            lines.append(key + separator + value)
        text = "\n".join(lines) + "\n\n" + body
    for pattern, replacement in VARYING_IN_TEXT:
        text = pattern.sub(replacement, text)
    return text


def read_sizes_add_up(reads: Path) -> None:
    sizes = [read["n"] for read in json.loads(reads.read_text())]
    stream = reads.with_name(reads.name.removesuffix(".reads.json") + ".sse")
    assert sum(sizes) == len(stream.read_bytes()) and all(size > 0 for size in sizes), reads


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("litellm-captures")
    asyncio.run(capture(folder))
    return folder


def test_the_same_cases_are_captured(regenerated: Path) -> None:
    assert [path.name for path in capture_files(regenerated)] == [path.name for path in capture_files(COMMITTED)]


@pytest.mark.parametrize("name", [path.name for path in capture_files(COMMITTED)])
def test_committed_capture_is_what_litellm_answers(regenerated: Path, name: str) -> None:
    committed, fresh = COMMITTED / name, regenerated / name
    assert fresh.is_file(), f"{name} was not regenerated"
    if name.endswith(".reads.json"):
        read_sizes_add_up(committed)
        read_sizes_add_up(fresh)
    else:
        assert normalised(fresh) == normalised(committed)
