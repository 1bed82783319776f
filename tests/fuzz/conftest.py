"""Fuzzing fixtures and the bounded, reproducible hypothesis settings of the fuzz tests.

How many examples a test runs follows the run's depth (tests/support/depth.py: a tenth in
the quick tier, twenty times with `MLPA_FUZZ=long`); every depth but the long one is
derandomized, so CI is reproducible, and only the long one remembers failures in `.hypothesis/`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support.depth import derandomized, examples

from .live_service import LiveService, live_service


def fuzz_settings(max_examples: int, **overrides: object) -> settings:
    """`max_examples` at the usual depth, scaled to this run's; derandomized but at the long one."""
    return settings(
        max_examples=examples(max_examples),
        derandomize=derandomized(),
        database=None if derandomized() else settings.default.database,
        deadline=None,
        print_blob=True,
        # Function-scoped fixtures (the live service's error check) deliberately span all
        # the examples of a test.
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
        **overrides,  # type: ignore[arg-type]
    )


# Package scope: the service thread and its keep-alive connections end with the fuzz
# tests, not in the middle of a later test that counts garbage or threads.
@pytest.fixture(scope="package")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    with live_service(Path(tmp_path_factory.mktemp("live"))) as service:
        yield service


def _event(record: logging.LogRecord) -> str:
    return str(record.msg.get("event", "")) if isinstance(record.msg, dict) else ""


@pytest.fixture
def no_new_errors(live: LiveService) -> Iterator[None]:
    """The test must not make the service log an ERROR or a traceback.

    One ERROR is by design (compatibility.md §4.6): LiteLLM answering an error the classifier does
    not know (`*_upstream_error`, no traceback), e.g. its 400 for an empty search query.
    """
    before = len(live.errors.records)
    yield
    new = [
        r
        for r in live.errors.records[before:]
        if r.exc_info or not (r.levelno == logging.ERROR and _event(r).endswith("_upstream_error"))
    ]
    assert not new, [f"{r.name}: {r.getMessage()}" for r in new]
