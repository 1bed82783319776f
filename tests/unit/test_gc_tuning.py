"""The collector's settings for long-lived streams, and its pauses in /metrics."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp.gc_tuning import settle_heap

from ..conftest import Service


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_settle_heap_freezes_what_is_alive_and_sets_the_young_threshold(restored_collector: None) -> None:
    survivor = [object()]  # alive when the heap is settled
    _, middle, old = gc.get_threshold()
    settle_heap(12345, freeze=True)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (12345, middle, old)
    # Frozen objects are not in any generation a collection walks.
    assert not any(survivor is obj for generation in range(3) for obj in gc.get_objects(generation))


def test_zero_keeps_cpythons_threshold_and_no_freeze(restored_collector: None) -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    settle_heap(0, freeze=False)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen


async def test_collections_are_timed_by_generation_in_metrics(service: Service) -> None:
    async def scrape() -> dict[tuple[str, str], float]:
        response = await service.client.get("/metrics")
        assert response.status == 200
        found = {}
        for family in text_string_to_metric_families(await response.text()):
            if family.name == "mlpa_gc_pause_seconds":
                for sample in family.samples:
                    if sample.name.endswith(("_count", "_sum")):
                        found[(sample.name.rsplit("_", 1)[1], sample.labels["generation"])] = sample.value
        return found

    before = await scrape()
    gc.collect()  # one full collection, generation 2
    gc.collect(0)
    after = await scrape()
    assert after[("count", "2")] >= before[("count", "2")] + 1
    assert after[("count", "0")] >= before[("count", "0")] + 1
    assert after[("sum", "2")] > before[("sum", "2")]
    assert set(gen for _, gen in after) == {"0", "1", "2"}
