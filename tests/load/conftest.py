"""Load tests: the fakes run in this process and see thousands of hang-ups. Their own
"Error handling request" lines (aiohttp writing to a client that left) are noise here."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from ..conftest import Service, ServiceFactory
from .harness import raise_open_file_limit

# The relays a load test runs against (RELAY_FAST_PATH off and on).
RELAY_PATHS = ("regular", "fast")


def relay_env(path: str) -> dict[str, str]:
    return {"RELAY_FAST_PATH": "true" if path == "fast" else "false"}


@pytest.fixture(params=RELAY_PATHS)
def make_service(request: pytest.FixtureRequest, make_service: ServiceFactory) -> ServiceFactory:
    """In-process load tests run on both relays."""

    async def build(**env: str) -> Service:
        return await make_service(**{**relay_env(request.param), **env})

    return build


@pytest.fixture(autouse=True)
def _quiet_fake_servers() -> Iterator[None]:
    raise_open_file_limit()
    logger = logging.getLogger("aiohttp.server")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
