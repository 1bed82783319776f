"""Load tests: the fakes run in this process and see thousands of hang-ups. Their own
"Error handling request" lines (aiohttp writing to a client that left) are noise here."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from tests.support.relays import make_service_on_both_relays  # noqa: F401 (fixture: in-process load tests on both relays)

from .harness import raise_open_file_limit


@pytest.fixture(autouse=True)
def _quiet_fake_servers() -> Iterator[None]:
    raise_open_file_limit()
    logger = logging.getLogger("aiohttp.server")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
