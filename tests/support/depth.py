"""How deep the property tests (hypothesis, schemathesis) search: one settings profile each.

Every property test states its example budget at the usual depth and asks `examples(budget)`
for the number to run; the loaded profile's `max_examples` over hypothesis's default of 100
scales it:

* `shallow` (max_examples 10: a tenth of each budget), the quick tier's: a run whose `-m`
  leaves out `slow` (`python -m pytest -m "not slow"`), or `MLPA_FUZZ=shallow`;
* hypothesis's own `default` (or `ci`, which it loads itself where CI=true): each budget as
  written, the whole suite's;
* `long` (twenty times each budget, fresh random examples, failures remembered in
  `.hypothesis/`): `MLPA_FUZZ=long`.

`--hypothesis-profile NAME` on the command line wins over all of these.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import settings

SHALLOW, LONG = "shallow", "long"
USUAL_EXAMPLES = 100  # hypothesis's default max_examples: the depth the budgets are written for
_QUICK_TIER = re.compile(r"\bnot\s+slow\b")


def register_profiles() -> None:
    settings.register_profile(SHALLOW, parent=settings.default, max_examples=USUAL_EXAMPLES // 10)
    settings.register_profile(
        LONG, parent=settings.get_profile("default"), max_examples=USUAL_EXAMPLES * 20, derandomize=False
    )


def choose_profile(config: pytest.Config) -> None:
    """Load the profile this run asks for (see the module's docstring)."""
    register_profiles()
    if config.getoption("hypothesis_profile", default=None):
        return  # hypothesis's own plugin loads it
    wanted = os.environ.get("MLPA_FUZZ", "").strip().lower()
    if wanted in (SHALLOW, LONG):
        settings.load_profile(wanted)
    elif wanted:
        raise pytest.UsageError(f"MLPA_FUZZ={wanted!r}: use {SHALLOW!r} or {LONG!r} (or --hypothesis-profile NAME)")
    elif _QUICK_TIER.search(config.getoption("markexpr", default="") or ""):
        settings.load_profile(SHALLOW)


def scale() -> float:
    return settings.default.max_examples / USUAL_EXAMPLES


def examples(budget: int) -> int:
    """`budget` (the examples a test runs at the usual depth) at the loaded profile's depth."""
    return max(1, round(budget * scale()))


def derandomized() -> bool:
    """The same examples every run (every profile but `long`): failures reproduce as they are."""
    return settings.get_current_profile_name() != LONG


def describe() -> str:
    return f"property tests: hypothesis profile {settings.get_current_profile_name()!r}, {scale():g}x each test's examples"
