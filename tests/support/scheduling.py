"""How pytest-xdist shares the suite between workers (`python -m pytest -n 2`).

As `--dist loadscope` (setup.cfg's default): a module's tests run on one worker, so its
module fixtures start once. One exception: the whole slow tier (tests/support/tiers.py) is
one unit, so its tests run one after another on one worker, never two at once. They measure
a service process under load, start gunicorn, Chromium, Prometheus and the real LiteLLM, and
hold timing bounds; two of them side by side would share the machine's cores with each
other. The quick tier's modules fill the other workers meanwhile. Being the largest unit,
the slow tier is handed out first, and the run takes about as long as it does.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

from .tiers import slow_markers

SLOW_TIER = "the slow tier"


def shared_unit(nodeid: str) -> str | None:
    """The unit a test belongs to beyond its module's, if any: the slow tier's."""
    return SLOW_TIER if slow_markers(nodeid.split("::", 1)[0]) else None


class SlowTierOnOneWorker(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return shared_unit(nodeid) or super()._split_scope(nodeid)
