"""The aiohttp versions this service's uses of aiohttp internals were tested on, and the one
check each such use makes once at start (docs/architecture.md, "aiohttp internals").

Two modules lean on aiohttp beyond its public API, each for speed only and each with the
public path as its fallback: the relay's fast path (relay/fast_path.py) and the upstream
connector (upstream/connector.py). Each calls `fence` when the app starts: if the running
aiohttp is outside the tested range, or lacks an attribute the module uses, the module
stays off, with one WARNING naming the version, and the service runs on public API alone.
`.ci/run` runs the relay suites on both ends of the range and on the newest aiohttp release.

setup.cfg allows more than this range: every patch release of the same minor (`<3.15`), so
a security release installs at once. A patch newer than TESTED_HIGHEST is fenced off (one
WARNING, the regular relay and connector) until its internals are checked and
TESTED_HIGHEST is raised to it; the fence, not the installed version, decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import aiohttp
import structlog

log = structlog.get_logger(__name__)

# Both ends inclusive; both are run in CI (.ci/run) with the fast path and the connector on.
# TESTED_LOWEST is setup.cfg's lower bound; TESTED_HIGHEST stays below its upper bound.
TESTED_LOWEST = (3, 14, 0)
TESTED_HIGHEST = (3, 14, 5)


def _release(version: str) -> tuple[int, ...] | None:
    """(3, 14, 5) for "3.14.5"; None for anything that is not a plain final release."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in match.groups()) if match else None


def fence(use: str, missing: Iterable[str], *, version: str | None = None) -> bool:
    """Whether `use` (a short name for the log) may run: the running aiohttp (`version`,
    for tests) is in the tested range and `missing` (the attributes the caller looked for
    and did not find) is empty. Otherwise logs one WARNING and returns False."""
    version = aiohttp.__version__ if version is None else version
    release = _release(version)
    absent = sorted(missing)
    if release is not None and TESTED_LOWEST <= release <= TESTED_HIGHEST and not absent:
        return True
    log.warning(
        "aiohttp_internals_fenced_off",
        use=use,
        aiohttp_version=version,
        tested_range=f"{'.'.join(map(str, TESTED_LOWEST))}-{'.'.join(map(str, TESTED_HIGHEST))}",
        missing=absent,
        fallback="public aiohttp API",
    )
    return False


def missing_attributes(owner: object, names: Iterable[str]) -> list[str]:
    """Those of `names` that `owner` (a class or an instance) lacks, as `Owner.name`."""
    label = getattr(owner, "__name__", type(owner).__name__)
    return [f"{label}.{name}" for name in names if not hasattr(owner, name)]
