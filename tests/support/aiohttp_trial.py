"""The relay suites on an aiohttp newer than the tested range (.ci/run's stage on the newest
release): with `MLPA_TEST_AIOHTTP_TRIAL=1` the fence of process/aiohttp_internals.py is
opened to the running aiohttp for this test run only, so the suites exercise the fast path
and the direct connector on its internals. Green means TESTED_HIGHEST may be raised to it;
production keeps the fence closed until then (one WARNING, the public path)."""

from __future__ import annotations

import os

import aiohttp
from packaging.version import Version

from mlpa_aiohttp.process import aiohttp_internals

TRIAL_VARIABLE = "MLPA_TEST_AIOHTTP_TRIAL"


def open_fence_if_asked() -> None:
    if os.environ.get(TRIAL_VARIABLE) != "1":
        return
    running = Version(aiohttp.__version__).release
    # Only a later patch of the tested minor: a new minor is a deliberate widening of setup.cfg.
    if running[:2] == aiohttp_internals.TESTED_HIGHEST[:2] and running > aiohttp_internals.TESTED_HIGHEST:
        aiohttp_internals.TESTED_HIGHEST = (running[0], running[1], running[2])
