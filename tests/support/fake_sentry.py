"""A loopback Sentry ingestion endpoint that records what the real SDK sends.

Serve `FakeSentry().make_app()` (for example with pytest-aiohttp's `aiohttp_server`) and point
the SDK at `fake.dsn(server.port)`. It accepts `POST /api/<project>/envelope/` in the
envelope format: a JSON header line, then for each item a JSON item header line and its
payload (exactly `length` bytes when the header gives one, else up to the end of the line).
Gzip-compressed bodies (the SDK's default without brotli) and brotli ones (when the
`brotli` module is installed) are accepted.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


class EnvelopeError(ValueError):
    """The body is not a well-formed Sentry envelope."""


@dataclass(frozen=True, slots=True)
class EnvelopeItem:
    headers: dict[str, Any]
    payload: bytes

    @property
    def type(self) -> str | None:
        return self.headers.get("type")

    def json(self) -> Any:
        return json.loads(self.payload)


@dataclass(frozen=True, slots=True)
class Envelope:
    project: str
    headers: dict[str, Any]
    items: tuple[EnvelopeItem, ...]
    raw: bytes


def parse_envelope(body: bytes, *, project: str = "") -> Envelope:
    header_line, rest = _split_line(body, 0)
    if not header_line.strip():
        raise EnvelopeError("missing envelope header")
    headers = _json_object(header_line, "envelope header")
    items = []
    position = rest
    while position < len(body):
        line, position = _split_line(body, position)
        if not line.strip():
            continue  # a trailing newline
        item_headers = _json_object(line, "item header")
        length = item_headers.get("length")
        if length is None:
            payload, position = _split_line(body, position)
        else:
            if not isinstance(length, int) or length < 0 or position + length > len(body):
                raise EnvelopeError(f"bad item length {length!r}")
            payload = body[position : position + length]
            position += length
            if body[position : position + 1] == b"\n":
                position += 1
        items.append(EnvelopeItem(item_headers, payload))
    return Envelope(project, headers, tuple(items), body)


def _split_line(body: bytes, start: int) -> tuple[bytes, int]:
    end = body.find(b"\n", start)
    if end == -1:
        return body[start:], len(body)
    return body[start:end], end + 1


def _json_object(line: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise EnvelopeError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise EnvelopeError(f"{what} is not a JSON object")
    return value


def _decode_body(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    if encoding == "br":
        try:
            import brotli  # type: ignore[import-not-found]
        except ImportError:
            raise EnvelopeError("brotli body but the brotli module is not installed") from None
        return brotli.decompress(raw)
    raise EnvelopeError(f"unsupported Content-Encoding {encoding!r}")


@dataclass
class FakeSentry:
    """Records every envelope received; `events` are the error events among them."""

    envelopes: list[Envelope] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def make_app(self) -> web.Application:
        # Decompress here, not in aiohttp's parser, so the SDK's Content-Encoding is checked too.
        app = web.Application(handler_args={"auto_decompress": False})
        app.router.add_post("/api/{project}/envelope/", self._receive)
        return app

    @staticmethod
    def dsn(port: int, *, host: str = "127.0.0.1", project: int = 1, public_key: str = "public") -> str:
        return f"http://{public_key}@{host}:{port}/{project}"

    @property
    def events(self) -> list[dict[str, Any]]:
        return [item.json() for env in self.envelopes for item in env.items if item.type == "event"]

    async def _receive(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = _decode_body(raw, request.headers.get("Content-Encoding", ""))
            envelope = parse_envelope(body, project=request.match_info["project"])
        except (EnvelopeError, OSError, zlib.error) as exc:
            self.rejected.append(str(exc))
            return web.json_response({"detail": str(exc)}, status=400)
        self.envelopes.append(envelope)
        event_ids = [item.json().get("event_id") for item in envelope.items if item.type == "event"]
        return web.json_response({"id": event_ids[0] if event_ids else envelope.headers.get("event_id")})
