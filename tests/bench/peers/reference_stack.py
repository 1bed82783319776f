"""What the FastAPI original does around its relay, minus auth (compatibility.md §4.4, §5.1, §6).

A stream in the original passes through four Starlette "http" function middlewares
(`@app.middleware("http")`, i.e. `BaseHTTPMiddleware`, each of which re-wraps a streaming
body through its own memory stream), and every relayed chunk is inspected: decoded, split
into lines, every `data:` line JSON-parsed for `usage` and tool calls. These peers do the
same work so that the comparison is with the original's design, not with a bare relay
(the bare relay is still measured, as `fastapi-receive-bare`).

Metrics go to a private registry that nobody scrapes: their cost is in the recording.
"""

from __future__ import annotations

import contextvars
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_REQUEST_SIZE_BYTES = 3 * 1024 * 1024
FIREFOX_VERSION = re.compile(r".*?Firefox/(\d+\.\d+)")

registry = CollectorRegistry()
in_progress = Gauge("mlpa_in_progress_requests", "", registry=registry)
requests_total = Counter(
    "mlpa_requests_total", "", ["method", "endpoint", "service_type", "purpose", "major_fx_version"], registry=registry
)
status_codes = Counter("mlpa_response_status_codes_total", "", ["status_code"], registry=registry)
request_latency = Histogram("mlpa_request_latency_seconds", "", ["method", "endpoint"], registry=registry)
completion_latency = Histogram(
    "mlpa_chat_completion_latency_seconds", "", ["result", "model", "service_type", "purpose"], registry=registry
)
ttft = Histogram("mlpa_chat_completion_ttft_seconds", "", ["model"], registry=registry)
tokens_total = Counter("mlpa_chat_tokens_total", "", ["type", "model", "service_type", "purpose"], registry=registry)
availability = Counter(
    "mlpa_chat_availability_total", "", ["outcome", "reason", "model", "service_type", "purpose"], registry=registry
)

# The original binds these with loguru's contextualize(); a context variable costs the same.
log_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("log_context", default=None)

CallNext = Callable[[Request], Awaitable[Response]]


def install_middlewares(app: FastAPI) -> None:
    """Registered innermost first, so they run as compatibility.md §5.1 lists them (size limit outermost)."""

    @app.middleware("http")
    async def json_content_type_for_play(request: Request, call_next: CallNext) -> Response:
        if request.method == "POST" and request.url.path == "/verify/play":
            request.scope["headers"] = [
                *[(k, v) for k, v in request.scope["headers"] if k != b"content-type"],
                (b"content-type", b"application/json"),
            ]
        return await call_next(request)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: CallNext) -> Response:
        response = await call_next(request)
        response.headers["X-Content-Type-Options"] = "nosniff"
        if request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https":
            response.headers["Strict-Transport-Security"] = "max-age=31536000; includeSubDomains"
        return response

    @app.middleware("http")
    async def instrumentation(request: Request, call_next: CallNext) -> Response:
        in_progress.inc()
        headers = request.headers
        token = log_context.set({
            "service_type": headers.get("service-type", "N/A"),
            "session_id": headers.get("session-id", "N/A"),
            "user_agent": headers.get("user-agent", "N/A"),
            "use_app_attest": headers.get("use-app-attest", "N/A"),
        })
        started = time.perf_counter()
        try:
            response = await call_next(request)
            route = request.scope.get("route")
            endpoint = getattr(route, "path", request.url.path)
            request_latency.labels(request.method, endpoint).observe(time.perf_counter() - started)
            version = FIREFOX_VERSION.match(headers.get("user-agent", ""))
            major = version.group(1).split(".")[0] if version else ""
            requests_total.labels(
                request.method, endpoint, headers.get("service-type", "unknown"), headers.get("x-purpose", "unknown"),
                major if major.startswith("1") and len(major) == 3 else "unknown",
            ).inc()
            status_codes.labels(str(response.status_code)).inc()
            return response
        finally:
            log_context.reset(token)
            in_progress.dec()

    @app.middleware("http")
    async def request_size_limit(request: Request, call_next: CallNext) -> Response:
        if request.method == "POST" and request.url.path == "/v1/chat/completions":
            length = request.headers.get("content-length", "")
            if length.isdigit() and int(length) > MAX_REQUEST_SIZE_BYTES:
                return JSONResponse({"error": 3}, status_code=413)
        return await call_next(request)


class ChunkInspector:
    """The original's per-chunk look (compatibility.md §4.4): usage and tool calls, best effort."""

    def __init__(self, model: str, started: float) -> None:
        self.model = model
        self.started = started
        self.chunks = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tool_calls: dict[int, dict[str, Any]] = {}

    def inspect(self, chunk: bytes) -> None:
        self.chunks += 1
        if self.chunks == 1:
            ttft.labels(self.model).observe(time.perf_counter() - self.started)
        try:
            for line in chunk.decode("utf-8").split("\n"):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                usage = event.get("usage")
                if usage:
                    self.prompt_tokens = usage.get("prompt_tokens", 0)
                    self.completion_tokens = usage.get("completion_tokens", 0)
                choices = event.get("choices") or [{}]
                for call in (choices[0].get("delta") or {}).get("tool_calls") or []:
                    entry = self.tool_calls.setdefault(call.get("index", len(self.tool_calls)), {})
                    name = (call.get("function") or {}).get("name")
                    if name and not entry.get("name"):
                        entry["name"] = name
        except (UnicodeDecodeError, json.JSONDecodeError):
            return  # the rest of this chunk is skipped; the chunk is still relayed

    def finish(self, result: str, service_type: str, purpose: str) -> None:
        labels = (self.model, service_type, purpose)
        completion_latency.labels(result, *labels).observe(time.perf_counter() - self.started)
        if result == "success":
            availability.labels("success", "none", *labels).inc()
            for side, count in (("prompt", self.prompt_tokens), ("completion", self.completion_tokens)):
                if count > 0:
                    tokens_total.labels(side, *labels).inc(count)
        else:
            availability.labels("abort", "client_disconnect", *labels).inc()
