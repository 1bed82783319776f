"""The real LiteLLM's responses captured byte for byte, read from the shared folder at test
time (never copied into the repo): `<repo>/../shared/data/litellm-1.106.12`, or the folder
named by `MLPA_LITELLM_CAPTURES`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURES_ENV = "MLPA_LITELLM_CAPTURES"
CAPTURES_SUBDIR = Path("shared") / "data" / "litellm-1.106.12"


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
    """The env override, else `shared/` beside the repo (or beside one of its parent
    folders, for a git worktree nested deeper than the main checkout)."""
    override = os.environ.get(CAPTURES_ENV)
    if override:
        return Path(override)
    for folder in REPO_ROOT.parents:
        if (folder / CAPTURES_SUBDIR).is_dir():
            return folder / CAPTURES_SUBDIR
    return REPO_ROOT.parent / CAPTURES_SUBDIR


def require_captures() -> Path:
    folder = captures_dir()
    if not (folder / "README.md").is_file():
        pytest.skip(f"LiteLLM captures not found at {folder} (set {CAPTURES_ENV})")
    return folder


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
    return _load(str(require_captures()), name)


def names() -> list[str]:
    folder = captures_dir()
    return sorted(path.stem for path in folder.glob("*.http")) if folder.is_dir() else []
