"""Firefox for Android's MLPA client (android-components `lib/llm-mlpa`), written out in Python.

Requests are built and answers read the way its Kotlin source does (read 2026-12-01;
`service/FetchClientMlpaService.kt` @7eae2002, `service/ext/Response.kt` @832ed8c0 and later,
`MlpaLlm.kt`, `MlpaTokenProvider.kt`); docs/clients.md says what each rule means to a user.

- Grant: `POST /verify/play` with no extra headers, body `{"user_id": <per-install UUID>,
  "integrity_token": ..., "package_name": ...}` (kotlinx.serialization, compact). The token is
  requested from Play Integrity with `requestHash` = SHA-256 hex of the UUID. A 4xx fails the
  grant; otherwise `{access_token, token_type, expires_in}` is decoded and cached.
- Chat: `POST /v1/chat/completions`, headers `authorization: Bearer <token>`,
  `content-type: application/json`, `service-type: s2s-android` (older builds: `s2s`),
  `use-play-integrity: true` for a Play grant; body `{"model": "moz-summarization",
  "messages": [...], "stream": true}` plus `temperature`/`top_p` in builds that send their
  defaults (kotlinx omits default values unless told otherwise: both shapes exist).
- Statuses: 401 InvalidToken, 403 UserBlocked, 413 RequestTooLarge, 429 decodes a top-level
  `{"error": N}` (1 BudgetExceeded, 2 RateLimited, else ServerError), 502 UpstreamError,
  anything else not 2xx ServerError(status).
- Stream: the body read line by line; lines that are empty or contain `[DONE]` dropped; the
  first six characters cut off every other line; the rest decoded as an Event {id: String,
  created: Long, choices: [{index: Int, delta: {content: String = ""}}]} (unknown keys
  ignored). A line that does not decode is tried as `{"error": N}`: 1 BudgetExceeded,
  2 RateLimited, else ServerError(429); a line that is neither ends the answer with a parse
  error.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.support.fake_google import FakeGoogle, make_verdict

SERVICE_TYPE = "s2s-android"
LEGACY_SERVICE_TYPE = "s2s"
MODEL = "moz-summarization"
PACKAGE_NAME = "org.mozilla.firefox"
DATA_PREFIX_LENGTH = len("data: ")
END_OF_STREAM_MARKER = "[DONE]"

# What the app shows, by the error its service layer raises.
BUDGET_EXCEEDED = "BudgetExceeded"
RATE_LIMITED = "RateLimited"
SERVER_ERROR = "ServerError"
INVALID_TOKEN = "InvalidToken"
USER_BLOCKED = "UserBlocked"
REQUEST_TOO_LARGE = "RequestTooLarge"
UPSTREAM_ERROR = "UpstreamError"
PARSE_ERROR = "ParseError"


@dataclass
class AndroidAnswer:
    """What the summary screen gets: the text so far and the error that ended it, if any."""

    status: int
    text: str = ""
    error: str | None = None
    error_status: int | None = None  # ServerError's status
    retry_after: int | None = None
    lines: list[str] = field(default_factory=list)  # every line the reader saw


class ChatServiceError(Exception):
    def __init__(self, kind: str, *, status: int | None = None, retry_after: int | None = None) -> None:
        super().__init__(kind)
        self.kind, self.status, self.retry_after = kind, status, retry_after


def _error_for_code(code: Any, retry_after: int | None, fallback_status: int) -> ChatServiceError:
    if code == 1:
        return ChatServiceError(BUDGET_EXCEEDED, retry_after=retry_after)
    if code == 2:
        return ChatServiceError(RATE_LIMITED, retry_after=retry_after)
    return ChatServiceError(SERVER_ERROR, status=fallback_status)


def _retry_after(headers: Any) -> int | None:
    value = headers.get("Retry-After")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _decode_error_code(text: str) -> Any:
    """kotlinx `ResponseErrorCode(error: Int)`: a top-level integer `error`, else a decode error."""
    try:
        decoded = json.loads(text)
    except ValueError:
        raise ChatServiceError(PARSE_ERROR) from None
    if not isinstance(decoded, dict) or not isinstance(decoded.get("error"), int) or isinstance(decoded["error"], bool):
        raise ChatServiceError(PARSE_ERROR)
    return decoded["error"]


def status_error(status: int, body: str, headers: Any) -> ChatServiceError | None:
    """`Response.error` of FetchClientMlpaService: the error a non-2xx status means."""
    if 200 <= status <= 299:
        return None
    if status == 401:
        return ChatServiceError(INVALID_TOKEN)
    if status == 403:
        return ChatServiceError(USER_BLOCKED)
    if status == 413:
        return ChatServiceError(REQUEST_TOO_LARGE)
    if status == 429:
        try:
            return _error_for_code(_decode_error_code(body), _retry_after(headers), status)
        except ChatServiceError as exc:  # the reference's {"detail": {"error": N}} lands here
            return exc
    if status == 502:
        try:
            reason = json.loads(body)
        except ValueError:
            return ChatServiceError(PARSE_ERROR)
        if not isinstance(reason, dict) or not isinstance(reason.get("error"), str):
            return ChatServiceError(PARSE_ERROR)
        return ChatServiceError(UPSTREAM_ERROR)
    return ChatServiceError(SERVER_ERROR, status=status)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_event(text: str) -> str:
    """The content of one Event, or ValueError where kotlinx would throw."""
    event = json.loads(text)
    if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not _is_int(event.get("created")):
        raise ValueError("not an Event")
    choices = event.get("choices")
    if not isinstance(choices, list):
        raise ValueError("choices")
    contents = []
    for choice in choices:
        if not isinstance(choice, dict) or not _is_int(choice.get("index")) or not isinstance(choice.get("delta"), dict):
            raise ValueError("choice")
        content = choice["delta"].get("content", "")
        if not isinstance(content, str):  # a JSON null for a non-null String with a default
            raise ValueError("content")
        contents.append(content)
    return ", ".join(contents)  # joinToString's default separator


def read_line(line: str, retry_after: int | None) -> str | None:
    """One line of the stream: its content, None when dropped, or the error it raises."""
    if line == "" or END_OF_STREAM_MARKER in line:
        return None
    payload = line[DATA_PREFIX_LENGTH:]
    try:
        return decode_event(payload)
    except ValueError:
        pass
    raise _error_for_code(_decode_error_code(payload), retry_after, 429)


def split_lines(body: str) -> list[str]:
    """BufferedReader.lineSequence(): lines ended by \\n, \\r or \\r\\n; no trailing empty line."""
    lines = body.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


@dataclass
class AndroidApp:
    """One install of Firefox for Android: its UUID, its cached grant, its request shape."""

    base_url: str
    google: FakeGoogle
    service_type: str = SERVICE_TYPE
    send_defaults: bool = True  # builds that serialise temperature/top_p defaults
    user_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    access_token: str | None = None

    @property
    def request_hash(self) -> str:
        return hashlib.sha256(self.user_id.encode("utf-8")).hexdigest()

    def integrity_token(self) -> str:
        """What Play Integrity hands the app for `requestHash` (the fake Google learns its verdict)."""
        token = f"play-integrity-{uuid.uuid4().hex}"
        self.google.verdicts[token] = make_verdict(self.user_id, package=PACKAGE_NAME, request_hash=self.request_hash)
        return token

    async def verify(self, session: aiohttp.ClientSession) -> str:
        body = json.dumps(
            {"user_id": self.user_id, "integrity_token": self.integrity_token(), "package_name": PACKAGE_NAME},
            separators=(",", ":"),
        )
        async with session.post(f"{self.base_url}/verify/play", data=body.encode()) as response:
            text = await response.text()
            if 400 <= response.status <= 499:
                raise ChatServiceError("VerificationServiceFailed", status=response.status)
        grant = json.loads(text)
        assert grant["token_type"] == "Bearer" and isinstance(grant["expires_in"], int)
        self.access_token = grant["access_token"]
        return self.access_token

    def chat_body(self, text: str) -> bytes:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Summarize the page."},
                {"role": "user", "content": text},
            ],
            "stream": True,
        }
        if self.send_defaults:
            body.update({"temperature": 0.1, "top_p": 0.01})
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    async def summarize(
        self, session: aiohttp.ClientSession, text: str = "A page about foxes.", *, token: str | None = None, body: bytes | None = None
    ) -> AndroidAnswer:
        if token is None:
            token = self.access_token or await self.verify(session)
        headers = {
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            "service-type": self.service_type,
            "use-play-integrity": "true",
        }
        async with session.post(
            f"{self.base_url}/v1/chat/completions", data=body if body is not None else self.chat_body(text), headers=headers
        ) as response:
            raw = (await response.read()).decode("utf-8", "replace")
            answer = AndroidAnswer(status=response.status)
            failure = status_error(response.status, raw, response.headers)
            if failure is None:
                retry_after = _retry_after(response.headers)
                answer.lines = split_lines(raw)
                try:
                    for line in answer.lines:
                        content = read_line(line, retry_after)
                        if content is not None:
                            answer.text += content
                except ChatServiceError as exc:
                    failure = exc
            if failure is not None:
                answer.error, answer.error_status, answer.retry_after = failure.kind, failure.status, failure.retry_after
            return answer
