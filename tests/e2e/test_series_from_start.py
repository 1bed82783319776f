"""A freshly started production process already exposes every series the shipped rules read.

Every test elsewhere scrapes a warm service. Here: gunicorn with config/gunicorn.conf.py, two
workers, the base ConfigMap's values (config/kubernetes/base/configmap.yaml) with overload
protection on as the overload overlay has it, `PROMETHEUS_MULTIPROC_DIR`, a catalogue file
with a service type and a model of its own, and a real PostgreSQL. Its `/metrics` is the
first request it gets. Every selector of the Prometheus rules (config/prometheus) and of
the prometheus-adapter rules (config/kubernetes), parsed from the files
(tests/support/promql.py), must find its metric, and a series for each label value it
names: an alert or an autoscaler reading a series that is not there yet sees nothing, not
zero (mlpa_aiohttp/observability/known_series.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp.observability.labels import SHED_REASONS
from tests.support.gunicorn import gunicorn_on_fakes
from tests.support.postgres import (
    ThrowawayPostgres,
    database_environ,
    prepare_databases,
)
from tests.support.promql import (
    adapter_rule_exprs,
    prometheus_rule_exprs,
    rule_selectors,
    unmet,
)

from ..conftest import TEST_SECRETS

REPO = Path(__file__).resolve().parents[2]
CONFIGMAP = REPO / "config" / "kubernetes" / "base" / "configmap.yaml"
# Series the rules read from elsewhere: Prometheus itself and kube-state-metrics.
EXTERNAL = frozenset({"up", "kube_pod_status_ready"})
WORKERS = 2
OWN_TYPE, OWN_MODEL = "deep-answer", "deep-model"
START_SECONDS = 40


@pytest.fixture
def postgres() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as server:
        # In a thread of its own: the test's event loop may already run.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
            executor.submit(asyncio.run, prepare_databases(server.settings())).result()
        yield server


def production_environ(postgres: ThrowawayPostgres, catalog: Path, metrics_dir: Path) -> dict[str, str]:
    """The base ConfigMap's values, pointed at this test's PostgreSQL and files."""
    configmap = yaml.safe_load(CONFIGMAP.read_text())["data"]
    return {
        **configmap,
        **TEST_SECRETS,
        **database_environ(postgres.settings()),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "MLPA_CATALOG_FILE": str(catalog),
        "OVERLOAD_PROTECTION": "true",  # the overload overlay, whose HPA reads the shed counter
        "SHUTDOWN_DRAIN_SECONDS": "1",
        "WEB_CONCURRENCY": str(WORKERS),
    }


def catalog_file(tmp_path: Path) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(
        (REPO / "config" / "catalog.toml").read_text()
        + textwrap.dedent(
            f"""
            [[service_type]]
            name = "{OWN_TYPE}"
            budget = {{ max_budget = 0.1, rpm_limit = 10, tpm_limit = 2000 }}

            [[model]]
            name = "{OWN_MODEL}"
            """
        )
    )
    return path


def samples_with_values(exposition: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    ]


def exposed_samples(exposition: str) -> list[tuple[str, dict[str, str]]]:
    return [(name, labels) for name, labels, _ in samples_with_values(exposition)]


def counter_keys_at_zero(metrics_dir: Path, name: str) -> set[tuple[int, tuple[tuple[str, str], ...]]]:
    """(pid, labels) of every `name` sample the workers wrote into their counter files at 0."""
    found = set()
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            _, sample_name, labels, _ = json.loads(key)
            if sample_name == name and value == 0:
                found.add((pid, tuple(sorted(labels.items()))))
    return found


@pytest.mark.postgres
async def test_a_fresh_process_exposes_every_series_the_rules_read_before_its_first_request(
    fake_litellm_server, fake_fxa_server, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    exprs, recorded = prometheus_rule_exprs()
    adapter = adapter_rule_exprs()
    read = list(rule_selectors(exprs + adapter, recorded, EXTERNAL))
    names = {selector.name for _, selector in read}
    # The parser found the rules (the five series that were absent at start among them).
    assert adapter and {
        "mlpa_shed_requests_total",
        "mlpa_budget_rows_restored_total",
        "mlpa_chat_availability_total",
        "mlpa_chat_completion_ttft_seconds_bucket",
        "mlpa_chat_completion_ttft_seconds_count",
        "mlpa_open_streams",
    } <= names, names

    metrics_dir = tmp_path / "multiproc"
    env = production_environ(postgres, catalog_file(tmp_path), metrics_dir)
    async with gunicorn_on_fakes(
        fake_litellm_server, fake_fxa_server, workers=WORKERS, user="fresh-user", log_path=tmp_path / "gunicorn.log",
        metrics_dir=metrics_dir, stop_seconds=15, **env,
    ) as server:
        # Ready without a request: gunicorn's "Worker ready" line once each app has started.
        deadline = time.monotonic() + START_SECONDS
        while server.output().count("Worker ready") < WORKERS:
            assert server.process.poll() is None, f"gunicorn exited:\n{server.output()}"
            assert time.monotonic() < deadline, f"the workers did not start:\n{server.output()}"
            await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as session, session.get(f"{server.base_url}/metrics") as response:
            assert response.status == 200
            exposition = await response.text()

        samples = exposed_samples(exposition)
        missing = [f"{rule.source}: {gap}" for rule, selector in read for gap in unmet(selector, samples)]
        assert not missing, "read by the shipped rules but absent from a fresh /metrics:\n" + "\n".join(missing)

        # At zero, from the loaded catalogue (its own service type and model included).
        values = {(name, tuple(sorted(labels.items()))): value for name, labels, value in samples_with_values(exposition)}
        for reason in SHED_REASONS:
            assert values[("mlpa_shed_requests_total", (("reason", reason),))] == 0
        for name in ("mlpa_shed_requests_total", "mlpa_chat_availability_total", "mlpa_budget_rows_restored_total"):
            series = [value for (n, _), value in values.items() if n == name]
            assert series and set(series) == {0.0}, name
        assert any(n == "mlpa_budget_rows_restored_total" and ("service_type", OWN_TYPE) in labels for n, labels in values)
        assert any(n == "mlpa_chat_completion_ttft_seconds_count" and ("model", OWN_MODEL) in labels for n, labels in values)

        # Multiprocess mode: each worker wrote the series into its own file at 0 when it made
        # the child, before counting anything.
        reasons_by_worker: dict[int, set[str]] = {}
        for pid, labels in counter_keys_at_zero(metrics_dir, "mlpa_shed_requests_total"):
            reasons_by_worker.setdefault(pid, set()).add(dict(labels)["reason"])
        assert list(reasons_by_worker.values()) == [set(SHED_REASONS)] * WORKERS, reasons_by_worker
