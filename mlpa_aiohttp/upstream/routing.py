"""LiteLLM routing headers on successful completions (compatibility.md §4.7)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


def _int_header(headers: Mapping[str, str], name: str) -> int:
    try:
        return int(headers.get(name, "0").strip())
    except ValueError:
        return 0


def _non_negative_float(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True, slots=True)
class RoutingInfo:
    backend: str
    attempted_fallbacks: int
    attempted_retries: int
    duration_seconds: float | None
    cost_usd: float | None

    @property
    def fallback_used(self) -> str:
        return "true" if self.attempted_fallbacks > 0 else "false"

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RoutingInfo:
        backend = (headers.get("x-litellm-model-api-base") or "").strip() or "unknown"
        duration_ms = _non_negative_float(headers, "x-litellm-response-duration-ms")
        return cls(
            backend=backend,
            attempted_fallbacks=_int_header(headers, "x-litellm-attempted-fallbacks"),
            attempted_retries=_int_header(headers, "x-litellm-attempted-retries"),
            duration_seconds=None if duration_ms is None else duration_ms / 1000.0,
            cost_usd=_non_negative_float(headers, "x-litellm-response-cost"),
        )
