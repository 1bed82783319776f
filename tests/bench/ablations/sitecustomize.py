"""Bench-only: take one step of a new stream away, to count what it costs (tests/bench/instructions.py).

Loaded as a `sitecustomize` when this directory leads PYTHONPATH; does nothing unless
MLPA_BENCH_ABLATE names steps (comma-separated). Each replacement keeps the request working
for the bench's one caller, so the difference in instructions per new stream is that step's
own work. Never used by tests or the service.

  parse     RequestRules.parse_chat answers its first result again (headers and body validation)
  auth      Authenticator.authenticate answers its first principal again (FxA cache hit, metrics)
  body      completion_body answers its first bytes again (the upstream body and its JSON)
  outcome   ending.record only stores the ending (the outcome's metrics and log fields)
  context   request_context passes through (request id, log fields, canonical line, request metrics)
  metrics   every prometheus-client metric does nothing
"""

from __future__ import annotations

import os
from typing import Any


def _memoize_first(owner: Any, name: str, *, is_async: bool) -> None:
    real = getattr(owner, name)
    first: list[Any] = []

    if is_async:
        async def replacement(*args: Any, **kwargs: Any) -> Any:
            if not first:
                first.append(await real(*args, **kwargs))
            return first[0]
    else:
        def replacement(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            if not first:
                first.append(real(*args, **kwargs))
            return first[0]

    setattr(owner, name, replacement)


def _ablate(steps: set[str]) -> None:
    if "parse" in steps:
        from mlpa_aiohttp.models import RequestRules

        _memoize_first(RequestRules, "parse_chat", is_async=False)
    if "auth" in steps:
        from mlpa_aiohttp.auth.dispatch import Authenticator

        _memoize_first(Authenticator, "authenticate", is_async=True)
    if "body" in steps:
        from mlpa_aiohttp.routes import proxy
        from mlpa_aiohttp.upstream.bodies import UpstreamBody

        real_body = proxy.completion_body
        first: list[bytes] = []

        def completion_body(chat: Any, **kwargs: Any) -> UpstreamBody:
            if not first:
                first.append(real_body(chat, **kwargs).take())
            return UpstreamBody(first[0])

        proxy.completion_body = completion_body  # type: ignore[assignment]
    if "outcome" in steps:
        from mlpa_aiohttp.relay import ending

        def record(request: Any, outcome: Any, decided: Any) -> None:
            request[ending.ENDING] = decided

        ending.record = record  # type: ignore[assignment]
    if "context" in steps:
        from aiohttp import web

        import mlpa_aiohttp.app as app_module

        @web.middleware
        async def passthrough(request: web.Request, handler: Any) -> web.StreamResponse:
            return await handler(request)

        app_module.request_context = passthrough  # type: ignore[assignment]
    if "metrics" in steps:
        from prometheus_client import metrics

        class _Nothing:
            def inc(self, *args: Any, **kwargs: Any) -> None: ...
            def dec(self, *args: Any, **kwargs: Any) -> None: ...
            def observe(self, *args: Any, **kwargs: Any) -> None: ...

        nothing = _Nothing()
        metrics.MetricWrapperBase.labels = lambda self, *args, **kwargs: nothing  # type: ignore[method-assign]
        for cls, names in ((metrics.Counter, ("inc",)), (metrics.Gauge, ("inc", "dec")), (metrics.Histogram, ("observe",))):
            for name in names:
                setattr(cls, name, lambda self, *args, **kwargs: None)


_steps = {step.strip() for step in os.environ.get("MLPA_BENCH_ABLATE", "").split(",") if step.strip()}
if _steps:
    _ablate(_steps)
