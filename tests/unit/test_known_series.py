"""Series that exist from start, at zero (mlpa_aiohttp/observability/known_series.py): a
metric's declared label values, from the fixed sets and the loaded catalogue, have their
series before the first event, in one process and in prometheus-client's multiprocess mode.
tests/e2e/test_series_from_start.py checks the same against a fresh gunicorn, for every
series the shipped rules read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp.catalog.file import parse_catalog
from mlpa_aiohttp.observability.known_series import known, known_rows
from mlpa_aiohttp.observability.labels import (
    BUDGET_LINK_REPAIR_SITES,
    BUDGET_ROW_REPAIR_SITES,
    SHED_REASONS,
)
from mlpa_aiohttp.observability.metrics import AVAILABILITY_OUTCOME, Counter, Metrics

REPO = Path(__file__).resolve().parents[2]
# The built-in catalogue with one more service type and model: the loaded catalogue's names,
# not the built-in ones, are the known values.
EXTRA_TYPE, EXTRA_MODEL = "deep-answer", "deep-model"
CATALOG_TEXT = (REPO / "config" / "catalog.toml").read_text() + textwrap.dedent(
    f"""
    [[service_type]]
    name = "{EXTRA_TYPE}"
    budget = {{ max_budget = 0.1, rpm_limit = 10, tpm_limit = 2000 }}

    [[model]]
    name = "{EXTRA_MODEL}"
    """
)


def series(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called `name`: its labels (sorted pairs, empty ones left out, as
    Prometheus stores them) and its value."""
    return {
        tuple(sorted((k, v) for k, v in sample.labels.items() if v)): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name
    }


def expected_series(service_types: list[str], models: list[str]) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    return {
        "mlpa_shed_requests_total": {(("reason", reason),) for reason in SHED_REASONS},
        "mlpa_chat_availability_total": {
            (("outcome", outcome), ("reason", reason)) for reason, outcome in AVAILABILITY_OUTCOME.items()
        },
        "mlpa_budget_rows_restored_total": {
            (("at", at), ("service_type", t)) for t in service_types for at in BUDGET_ROW_REPAIR_SITES
        },
        "mlpa_budget_links_restored_total": {
            (("at", at), ("service_type", t)) for t in service_types for at in BUDGET_LINK_REPAIR_SITES
        },
        "mlpa_chat_completion_ttft_seconds_count": {(("model", model),) for model in models},
    }


def test_declared_values_become_label_sets_in_the_metrics_order() -> None:
    assert list(known(reason=("a", "b")).label_sets(("reason",))) == [("a",), ("b",)]
    # `each` multiplies; labels not declared are empty.
    assert list(known(at=("x", "y"), service_type=("ai",)).label_sets(("service_type", "model", "at"))) == [
        ("ai", "", "x"),
        ("ai", "", "y"),
    ]
    # Rows go together, times `each`.
    rows = known_rows([{"reason": "r1", "outcome": "o1"}, {"reason": "r2", "outcome": "o2"}], model=("m",))
    assert list(rows.label_sets(("outcome", "reason", "model"))) == [("o1", "r1", "m"), ("o2", "r2", "m")]


def test_a_declared_label_the_metric_lacks_stops_its_definition() -> None:
    with pytest.raises(ValueError, match=r"\['reasons'\] are not labels of the metric \(reason\)"):
        Counter("mlpa_typo", "A typo", ("reason",), registry=CollectorRegistry(), known=known(reasons=("a",)))


def test_a_fresh_registry_has_every_declared_series_at_zero() -> None:
    catalog = parse_catalog(CATALOG_TEXT.encode())
    exposition = generate_latest(Metrics(CollectorRegistry(), catalog=catalog).registry).decode()
    for name, wanted in expected_series(list(catalog.names), sorted(catalog.known_models)).items():
        found = series(exposition, name)
        assert set(found) == wanted, name
        assert set(found.values()) == {0.0}, name
    assert (("at", "request"), ("service_type", EXTRA_TYPE)) in series(exposition, "mlpa_budget_rows_restored_total")
    assert (("model", EXTRA_MODEL),) in series(exposition, "mlpa_chat_completion_ttft_seconds_count")
    # No cross product: one availability series per reason, not per reason, model, type and purpose.
    assert len(series(exposition, "mlpa_chat_availability_total")) == len(AVAILABILITY_OUTCOME)


_MAKE_METRICS_AND_EXIT = textwrap.dedent(
    """
    import sys
    from prometheus_client import CollectorRegistry
    from mlpa_aiohttp.catalog.file import parse_catalog
    from mlpa_aiohttp.observability.metrics import Metrics

    Metrics(CollectorRegistry(), multiprocess=True, catalog=parse_catalog(sys.stdin.buffer.read()))
    """
)


def test_in_multiprocess_mode_a_worker_that_counted_nothing_writes_every_declared_series(tmp_path: Path) -> None:
    """prometheus-client's multiprocess values: making a child writes its key at 0 into the
    process's file, so the aggregate has the series though nothing was counted."""
    directory = tmp_path / "multiproc"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-c", _MAKE_METRICS_AND_EXIT], input=CATALOG_TEXT.encode(), env=env, check=True, timeout=60
    )
    assert list(directory.glob("counter_*.db")) and list(directory.glob("histogram_*.db"))
    aggregate = CollectorRegistry()
    MultiProcessCollector(aggregate, path=str(directory))
    exposition = generate_latest(aggregate).decode()
    catalog = parse_catalog(CATALOG_TEXT.encode())
    for name, wanted in expected_series(list(catalog.names), sorted(catalog.known_models)).items():
        found = series(exposition, name)
        assert set(found) == wanted, name
        assert set(found.values()) == {0.0}, name
