"""Traffic contracts' pure rules (docs/traffic-contracts.md): the decision per dimension, the windows,
and the service type -> feature mapping the catalogue holds."""

from __future__ import annotations

import pytest

from mlpa_aiohttp.catalog import BUILTIN_CATALOG
from mlpa_aiohttp.catalog.file import CatalogError, parse_catalog
from mlpa_aiohttp.fleet.traffic_contracts import (
    BORROWED,
    DEGRADED,
    NORMAL,
    Limits,
    decide,
    seconds_left,
    window_start,
)

from .test_catalog_file import MINIMAL


@pytest.mark.parametrize(
    ("feature_count", "basket_count", "limits", "mode", "limited_by", "ratio"),
    [
        (3, 3, Limits(2, 0), BORROWED, "feature", 1.5),
        (2, 2, Limits(2, 2), NORMAL, None, 0.0),  # equality is within contract
        (3, 5, Limits(2, 4), DEGRADED, "basket", 1.25),  # the basket wins over the feature
        (3, 4, Limits(2, 4), BORROWED, "feature", 1.5),
        (100, 100, Limits(0, 0), NORMAL, None, 0.0),  # 0: no limit
        (-1, -1, Limits(0, 0), NORMAL, None, 0.0),  # not read: counts 0
    ],
)
def test_the_decision(feature_count: int, basket_count: int, limits: Limits, mode: str, limited_by: str | None, ratio: float) -> None:
    decision = decide("RPM", feature_count, basket_count, limits, 7)
    assert (decision.mode, decision.limited_by, decision.ratio_over) == (mode, limited_by, ratio)
    assert decision.allowed is (limited_by is None)
    assert decision.retry_after_seconds == 7
    assert (decision.feature_count, decision.basket_count) == (max(feature_count, 0), max(basket_count, 0))


def test_windows() -> None:
    assert window_start(1789057699.5, 60) == 1789057680
    assert seconds_left(1789057680.0, 60) == 60
    assert seconds_left(1789057699.5, 60) == 41
    assert seconds_left(1789057739.9, 60) == 1


def test_the_built_in_feature_mapping_is_the_references() -> None:
    features = BUILTIN_CATALOG.traffic_features
    assert features["s2s"] == "s2s" and features["s2s-android"] == "s2s-android"
    assert {features[name] for name in BUILTIN_CATALOG.names if name not in ("s2s", "s2s-android")} == {"smart-window"}


def test_a_catalogue_file_names_a_types_feature() -> None:
    catalog = parse_catalog(MINIMAL.replace('name = "search"', 'name = "search"\ntraffic_feature = "s2s"').encode())
    assert catalog.traffic_features == {"ai": "smart-window", "search": "s2s"}
    with pytest.raises(CatalogError) as caught:
        parse_catalog(MINIMAL.replace('name = "ai"', 'name = "ai"\ntraffic_feature = "voice"').encode())
    assert caught.value.problems == (
        "service_type #1 'ai'.traffic_feature: expected one of 'smart-window', 's2s', 's2s-android', got 'voice'",
    )
