"""The suite's two tiers, decided by where a test lives, never by a hand-written mark.

A test is in the slow tier when what it needs is slow to get: it lives in a folder whose
tests all need such a thing, or in a module named `test_*_browser.py` (headless Chromium).
The collection (tests/conftest.py) gives it the `slow` marker and the marker of what it
needs; everything else is the quick tier, `python -m pytest -m "not slow"`. A helper that
starts a slow resource calls `require_slow_tier`, so a test elsewhere that reaches one
fails at once, saying where it belongs.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

import pytest

# folder under tests/ -> the markers its tests get besides `slow`
SLOW_FOLDERS: dict[str, tuple[str, ...]] = {
    "e2e": ("e2e",),  # real processes: gunicorn, serve, the demo, the wheel, the CLI
    "load": ("load",),  # load and faults over real sockets against a service process
    "real_litellm": ("e2e",),  # the real LiteLLM proxy and gunicorn in front of it
    "clients": (),  # the Firefox clients' emulations, every matrix cell (node and the OpenAI JS SDK for one)
}
BROWSER_MODULES = "_browser.py"  # test_*_browser.py: headless Chromium
BROWSER_MARKERS = ("browser",)


def slow_markers(path: str) -> tuple[str, ...]:
    """The markers a test in `path` (relative to the repository, `tests/...`) gets: () for
    the quick tier, else `slow` and what it needs."""
    parts = PurePosixPath(path.replace(os.sep, "/")).parts
    if len(parts) >= 3 and parts[0] == "tests" and parts[1] in SLOW_FOLDERS:
        return ("slow", *SLOW_FOLDERS[parts[1]])
    if parts and parts[-1].startswith("test_") and parts[-1].endswith(BROWSER_MODULES):
        return ("slow", *BROWSER_MARKERS)
    return ()


def require_slow_tier(resource: str) -> None:
    """Fail the running test unless it is in the slow tier (a no-op outside pytest, e.g. in a
    benchmark that borrows the helper)."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if current is None:
        return
    path = current.split("::", 1)[0]
    if not slow_markers(path):
        folders = ", ".join(f"tests/{name}" for name in SLOW_FOLDERS)
        pytest.fail(
            f"{path} {resource}, which belongs to the slow tier: move the test to one of {folders}"
            f" (or, for Chromium, a module named test_*{BROWSER_MODULES}); see docs/testing.md",
            pytrace=False,
        )
