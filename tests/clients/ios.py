"""Firefox for iOS's MLPA client (firefox-ios `BrowserKit/Sources/MLPAKit` and `LLMKit`),
written out in Python.

Requests are built and answers read the way its Swift source does (read 2026-12-01:
`AppAttestClient.swift`, `MLPAAppAttestServer.swift`, `AppAttestRequestAuth.swift`,
`MLPAJWTPayload.swift`, `LiteLLMClient.swift`, `SSEDataParser.swift`); docs/clients.md says
what each rule means to a user.

- Challenge: `GET /verify/challenge?key_id_b64=<key id>` built with URLComponents, which leaves
  `+`, `/` and `=` of the base64 key id as they are (the server reads `+` as a space and maps
  it back). Answer `{"challenge": ...}`; a non-2xx fails.
- Attestation, once per key: clientDataHash = SHA-256(challenge UTF-8); `POST /verify/attest`
  with no body, `Content-Type: application/json` and `Authorization: Bearer <JWT>`, the JWT an
  HS256 envelope under a random secret of {key_id_b64, challenge_b64 (base64 of the challenge's
  UTF-8), attestation_obj_b64, bundle_id}.
- Per request: a fresh challenge; the body re-serialised by JSONSerialization with
  `.sortedKeys` (compact, keys sorted, `/` escaped as `\\/`, non-ASCII as UTF-8); the Secure
  Enclave signs SHA-256 of exactly those bytes with its next counter; the JWT (with
  assertion_obj_b64) in Authorization, `service-type`, `use-app-attest: true`; a streamed
  request adds `Accept: text/event-stream` and `Connection: keep-alive`.
- Answer: any non-2xx status is `invalidResponse(statusCode)` (the app words 429, 403 and 413
  itself, anything else as a generic error); the body is never read.
- Stream (SSEDataParser): bytes fed one at a time; the buffer split on "\\n\\n" (or on
  "\\r\\n\\r\\n" when it holds no "\\n\\n"); each complete part trimmed of whitespace and
  newlines; empty parts skipped; parts not starting `data: ` skipped; `[DONE]` skipped; every
  other payload decoded strictly as a chunk {id: String, created: Int, model: String, object:
  String, choices: [{index: Int, delta: {role: String?, content: String?}}]}; a payload that
  does not decode ends the stream with `invalidDataEncoding`.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
from yarl import URL

from tests.support.app_attest_device import TestDevice

SERVICE_TYPE = "s2s"
MODEL = "mistral-small-2603"

# What the app shows, by status (its own wording of `invalidResponse`).
RATE_LIMITED = "rateLimited"  # 429
MAX_USERS = "maxUsersReached"  # 403
TOO_LARGE = "requestTooLarge"  # 413
GENERIC = "generic"  # any other status, a decoding failure, a cut connection
INVALID_DATA = "invalidDataEncoding"


class AppAttestServiceError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass
class IOSAnswer:
    status: int
    text: str = ""
    error: str | None = None  # INVALID_DATA, or f"invalidResponse({status})"
    shown: str | None = None  # what the user is told (None: the summary)
    raw: bytes = b""


def json_serialization_sorted(payload: Any) -> bytes:
    """JSONSerialization.data(withJSONObject:options: [.sortedKeys])."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # Foundation escapes every solidus; `/` only ever occurs inside strings here.
    return text.replace("/", "\\/").encode("utf-8")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_chunk(payload: str) -> str:
    """The text of one LiteLLMStreamResponse, or ValueError where JSONDecoder would throw."""
    chunk = json.loads(payload)
    if not isinstance(chunk, dict):
        raise ValueError("not an object")
    for name in ("id", "model", "object"):
        if not isinstance(chunk.get(name), str):
            raise ValueError(name)
    if not _is_int(chunk.get("created")) or not isinstance(chunk.get("choices"), list):
        raise ValueError("created/choices")
    texts = []
    for choice in chunk["choices"]:
        if not isinstance(choice, dict) or not _is_int(choice.get("index")) or not isinstance(choice.get("delta"), dict):
            raise ValueError("choice")
        delta = choice["delta"]
        for name in ("role", "content"):
            if delta.get(name) is not None and not isinstance(delta[name], str):
                raise ValueError(name)
        texts.append(delta.get("content"))
    # LiteLLMClient yields `choices.first?.delta.content` when there is one.
    return texts[0] if texts and texts[0] is not None else ""


class SSEDataParser:
    """Fed one byte at a time, as LiteLLMClient feeds it."""

    def __init__(self) -> None:
        self._buffer = ""
        self._pending = b""

    def parse(self, data: bytes) -> list[str]:
        self._pending += data
        try:
            chunk = self._pending.decode("utf-8")
        except UnicodeDecodeError:
            return []
        self._pending = b""
        self._buffer += chunk
        delimiter = "\n\n" if "\n\n" in self._buffer else "\r\n\r\n"
        parts = self._buffer.split(delimiter)
        self._buffer = parts[-1]
        texts = []
        for raw_event in parts[:-1]:
            event = raw_event.strip()
            if not event or not event.startswith("data: "):
                continue
            payload = event[len("data: "):]
            if payload == "[DONE]":
                continue
            try:
                texts.append(decode_chunk(payload))
            except ValueError:
                raise ValueError(INVALID_DATA) from None
        return texts


def shown_for_status(status: int) -> str:
    return {429: RATE_LIMITED, 403: MAX_USERS, 413: TOO_LARGE}.get(status, GENERIC)


@dataclass
class IOSApp:
    """One install of Firefox for iOS: its App Attest key (the fake Secure Enclave), its state."""

    base_url: str
    device: TestDevice
    service_type: str = SERVICE_TYPE
    attested: bool = False
    counter: int = 0  # the Secure Enclave's, shared by every request of the key
    challenge_urls: list[str] = field(default_factory=list)

    def challenge_url(self) -> URL:
        # URLComponents' query encoding keeps +, / and = of base64 as they are.
        return URL(f"{self.base_url}/verify/challenge?key_id_b64={self.device.key_id_b64}", encoded=True)

    async def fetch_challenge(self, session: aiohttp.ClientSession) -> str:
        url = self.challenge_url()
        self.challenge_urls.append(str(url))
        async with session.get(url) as response:
            text = await response.text()
            if not 200 <= response.status < 300:
                raise AppAttestServiceError(response.status, text)
        return json.loads(text)["challenge"]

    @staticmethod
    def envelope(key_id: str, challenge: str, object_key: str, object_data: bytes, bundle_id: str) -> str:
        fields = {
            "key_id_b64": key_id,
            "challenge_b64": base64.b64encode(challenge.encode("utf-8")).decode("ascii"),
            object_key: base64.b64encode(object_data).decode("ascii"),
            "bundle_id": bundle_id,
        }
        return jwt.encode(fields, str(uuid.uuid4()), algorithm="HS256")

    async def perform_attestation(self, session: aiohttp.ClientSession) -> None:
        if self.attested:
            return
        challenge = await self.fetch_challenge(session)
        attestation = self.device.attest(challenge.encode("utf-8"))  # clientDataHash = SHA-256(challenge)
        token = self.envelope(self.device.key_id_b64, challenge, "attestation_obj_b64", attestation, self.device.bundle_id)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        async with session.post(f"{self.base_url}/verify/attest", headers=headers) as response:
            text = await response.text()
            if not 200 <= response.status < 300:
                raise AppAttestServiceError(response.status, text)
        self.attested = True

    def summary_payload(self, text: str) -> dict[str, Any]:
        return {
            "temperature": 0.1,
            "top_p": 0.01,
            "max_tokens": 2000,
            "model": MODEL,
            "stream": True,
            "messages": [
                {"role": "system", "content": "You summarize web pages: https://example.com/a/b"},
                {"role": "user", "content": text},
            ],
        }

    async def signed_request(
        self, session: aiohttp.ClientSession, payload: dict[str, Any], *, wrong_key: bool = False
    ) -> tuple[bytes, dict[str, str]]:
        """LiteLLMClient.makeRequest + AppAttestRequestAuth.authenticate: body and headers."""
        await self.perform_attestation(session)
        first_body = json_serialization_sorted(payload)
        # The authenticator parses the body back and signs its re-serialisation.
        challenge = await self.fetch_challenge(session)
        body = json_serialization_sorted(json.loads(first_body))
        self.counter += 1
        assertion = self.device.assertion(body, self.counter, wrong_key=wrong_key)
        token = self.envelope(self.device.key_id_b64, challenge, "assertion_obj_b64", assertion, self.device.bundle_id)
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
            "service-type": self.service_type,
            "use-app-attest": "true",
        }
        if payload.get("stream") is True:
            headers.update({"Accept": "text/event-stream", "Connection": "keep-alive"})
        return body, headers

    async def send(self, session: aiohttp.ClientSession, body: bytes, headers: dict[str, str]) -> IOSAnswer:
        async with session.post(f"{self.base_url}/v1/chat/completions", data=body, headers=headers) as response:
            answer = IOSAnswer(status=response.status)
            if not 200 <= response.status < 300:
                answer.error = f"invalidResponse({response.status})"
                answer.shown = shown_for_status(response.status)
                return answer
            parser = SSEDataParser()
            try:
                async for piece in response.content.iter_any():
                    answer.raw += piece
                    for index in range(len(piece)):
                        for text in parser.parse(piece[index : index + 1]):
                            answer.text += text
            except ValueError as exc:
                answer.error, answer.shown = str(exc), GENERIC
            except aiohttp.ClientPayloadError:
                answer.error, answer.shown = "connectionLost", GENERIC
            return answer

    async def summarize(self, session: aiohttp.ClientSession, text: str = "A page about foxes.", **kw: Any) -> IOSAnswer:
        body, headers = await self.signed_request(session, self.summary_payload(text), **kw)
        return await self.send(session, body, headers)
