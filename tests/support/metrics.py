"""Reading the service's own metrics registry in tests (the app's `keys.METRICS`)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from mlpa_aiohttp import keys


def registry(service: Any) -> CollectorRegistry:
    """The registry of a test `Service` (or of an `aiohttp` app)."""
    app = getattr(service, "app", service)
    return app[keys.METRICS].registry


def recorded(service: Any, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The sample's value, or None when that series was never written."""
    return registry(service).get_sample_value(name, labels or {})


def sample(service: Any, name: str, labels: dict[str, str] | None = None) -> float:
    """The sample's value, 0.0 when that series was never written."""
    return recorded(service, name, labels) or 0.0


def samples(service: Any, name: str) -> list[tuple[dict[str, str], float]]:
    """Every non-zero sample called `name`, with its labels."""
    return [
        (dict(s.labels), s.value)
        for family in registry(service).collect()
        for s in family.samples
        if s.name == name and s.value
    ]
