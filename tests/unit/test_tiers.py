"""The suite's tiers follow where a test lives (tests/support/tiers.py, docs/testing.md), and a
quick-tier test that reaches a slow resource fails, saying where it belongs."""

from __future__ import annotations

import pytest

from tests.support.scheduling import SLOW_TIER, shared_unit
from tests.support.tiers import require_slow_tier, slow_markers


@pytest.mark.parametrize(
    "path,markers",
    [
        ("tests/unit/test_health.py", ()),
        ("tests/integration/test_admin_routes.py", ()),
        ("tests/fuzz/test_paths_fuzz.py", ()),
        ("tests/e2e/test_gunicorn.py", ("slow", "e2e")),
        ("tests/load/test_churn.py", ("slow", "load")),
        ("tests/real_litellm/test_real_litellm.py", ("slow", "e2e")),
        ("tests/clients/test_ios.py", ("slow",)),
        ("tests/unit/test_docs_page_browser.py", ("slow", "browser")),
        ("tests/integration/test_admin_page_browser.py", ("slow", "browser")),
    ],
)
def test_where_a_test_lives_decides_its_tier(path: str, markers: tuple[str, ...]) -> None:
    assert slow_markers(path) == markers


def test_every_collected_test_carries_the_markers_of_where_it_lives(request: pytest.FixtureRequest) -> None:
    items = request.session.items
    assert request.node in items
    for item in items:
        carried = {marker.name for marker in item.iter_markers()}
        assert set(slow_markers(item.nodeid.split("::", 1)[0])) <= carried, item.nodeid
    assert request.node.get_closest_marker("slow") is None


def test_a_quick_test_that_starts_a_slow_resource_fails_saying_where_it_belongs() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"tests/unit/test_tiers\.py starts gunicorn.*tests/e2e"):
        require_slow_tier("starts gunicorn")



def test_under_xdist_the_slow_tier_is_one_unit() -> None:
    assert {shared_unit(nodeid) for nodeid in (
        "tests/load/test_churn.py::test_churn_waves_leave_nothing_behind",
        "tests/e2e/test_gunicorn.py::test_sigterm_ends_open_streams_cleanly",
        "tests/unit/test_docs_page_browser.py::test_docs_page_renders_every_operation_offline",
        "tests/clients/test_ios.py::test_x[a-b]",
    )} == {SLOW_TIER}
    # The quick tier's tests keep xdist's unit: their module.
    assert shared_unit("tests/unit/test_health.py::test_x[a]") is None
    assert shared_unit("tests/integration/test_admin_routes.py::test_y") is None
