"""Both relays, the regular one and RELAY_FAST_PATH's, for the tests that stream.

A module (or conftest) whose every test must run on both imports the fixture:

    from tests.support.relays import make_service_on_both_relays  # noqa: F401 (fixture)

It overrides `make_service` there, so `service` and `make_service` build the service with
each relay in turn (the test's id says which). The fast path takes a stream over only if its body is
still arriving when LiteLLM's headers are in (a body complete by then is left to the regular
relay): a test that means to exercise it paces its upstream.
"""

from __future__ import annotations

import pytest

from tests.conftest import Service, ServiceFactory

RELAYS = ("regular", "fast")


def relay_env(relay: str) -> dict[str, str]:
    return {"RELAY_FAST_PATH": "true" if relay == "fast" else "false"}


@pytest.fixture(name="make_service", params=RELAYS)
def make_service_on_both_relays(request: pytest.FixtureRequest, make_service: ServiceFactory) -> ServiceFactory:
    async def build(**env: str) -> Service:
        return await make_service(**{**relay_env(request.param), **env})

    return build
