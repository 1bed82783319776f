"""The real LiteLLM's answers captured byte for byte: `tests/data/litellm-1.106.12` (made by
`python -m tests.real_litellm.capture`, its README says how), or the folder named by
`MLPA_LITELLM_CAPTURES` (e.g. a fresh regeneration to try the tests against)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from multidict import CIMultiDict

from .litellm_process import LITELLM_VERSION

CAPTURES_ENV = "MLPA_LITELLM_CAPTURES"
COMMITTED = Path(__file__).resolve().parents[1] / "data" / f"litellm-{LITELLM_VERSION}"


@dataclass(frozen=True)
class Capture:
    name: str
    request_line: str
    request_body: str
    status: int
    headers: CIMultiDict[str]
    body: bytes

    @property
    def request_json(self) -> Any:
        return json.loads(self.request_body)

    def json(self) -> Any:
        return json.loads(self.body)

    def sse_payloads(self) -> list[str]:
        """The `data:` payloads of a streamed body, in order."""
        text = self.body.decode()
        return [frame[len("data: ") :] for frame in text.split("\n\n") if frame.startswith("data: ")]


def captures_dir() -> Path:
    override = os.environ.get(CAPTURES_ENV)
    return Path(override) if override else COMMITTED


@cache
def _load(folder: str, name: str) -> Capture:
    raw = (Path(folder) / f"{name}.http").read_bytes()
    comments: dict[str, str] = {}
    while raw.startswith(b"#"):
        line, _, raw = raw.partition(b"\n")
        key, _, value = line[1:].decode().partition(":")
        comments[key.strip()] = value.strip()
    # Status line and headers end with one blank line; the body follows as received
    # (a chunked body is stored de-chunked).
    head, _, body = raw.partition(b"\n\n")
    lines = head.decode().split("\n")
    status = int(lines[0].split()[1])
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name_, _, value = line.partition(":")
        headers.add(name_.strip(), value.strip())
    sse = Path(folder) / f"{name}.sse"
    if sse.is_file():
        body = sse.read_bytes()  # the stream's body bytes exactly as received
    return Capture(name, comments.get("request", ""), comments.get("request body", ""), status, headers, body)


def load(name: str) -> Capture:
    return _load(str(captures_dir()), name)
