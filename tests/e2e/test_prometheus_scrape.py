"""A real Prometheus scrapes the service under gunicorn with two workers and multiprocess
metrics: its HTTP API returns the service's `mlpa_*` series with their labels and one
`process_*` series per worker (labelled by pid), and the shipped alert rules
(config/prometheus/mlpa-alerts.yml) load in it and evaluate cleanly.

Needs the `prometheus` binary (Debian's `prometheus` package, which `.ci/run` installs);
skipped with one line without it. Bounded: every wait has a deadline, the whole test well
under a minute.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, AsyncIterator

import aiohttp
import pytest

from tests.support.processes import free_port, stop_process

from ..conftest import TEST_SECRETS, chat_body

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
RULES = REPO_ROOT / "config" / "prometheus" / "mlpa-alerts.yml"
WORKERS = 2
JOB = "mlpa"  # the scrape job the shipped rules select
DEADLINE_SECONDS = 40




async def wait_for(what: str, check, deadline: float, log: Path) -> Any:
    """Poll `check()` (async; a falsy result means not yet) until the deadline."""
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text(errors='replace')[-4000:]}"
        await asyncio.sleep(0.2)


@pytest.fixture
async def service(fake_litellm_server, fake_fxa_server, tmp_path: Path) -> AsyncIterator[tuple[str, str, Path]]:
    """gunicorn with two workers and multiprocess metrics; yields its base URL, an FxA token
    and its log file, once both workers' apps have started."""
    (_, litellm_server), (fxa, fxa_server) = fake_litellm_server, fake_fxa_server
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO_ROOT),
        **TEST_SECRETS,
        "PORT": str(port),
        "GUNICORN_WORKERS": str(WORKERS),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "multiproc"),
        "SHUTDOWN_DRAIN_SECONDS": "1",
        "MLPA_STORE": "memory",
        "LITELLM_API_BASE": str(litellm_server.make_url("")).rstrip("/"),
        "FXA_BASE_URL": str(fxa_server.make_url("/v1")),
        "LOG_LEVEL": "INFO",
    }
    log_file: IO[bytes] = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"],
        cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS

        async def workers_ready() -> bool:
            assert process.poll() is None, log_path.read_text()
            return log_path.read_text(errors="replace").count("Worker ready") >= WORKERS

        await wait_for("both gunicorn workers", workers_ready, deadline, log_path)
        yield f"http://127.0.0.1:{port}", fxa.issue_jwt("prometheus-user"), log_path
    finally:
        stop_process(process)
        log_file.close()


@pytest.fixture
async def prometheus(service: tuple[str, str, Path], tmp_path: Path) -> AsyncIterator[str]:
    """Prometheus on loopback scraping the service every second with the shipped rules."""
    base, _, _ = service
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [base.removeprefix("http://")]}]}],
            }
        )
    )
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            cwd=tmp_path, stdout=log_file, stderr=subprocess.STDOUT,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(process)
            # Asserted here, after the stop, so the log is whole: the rules loaded without error.
            text = log_path.read_text(errors="replace")
            assert "error loading rules" not in text.lower(), text[-4000:]


async def api(session: aiohttp.ClientSession, base: str, path: str, **params: str) -> Any:
    try:
        async with session.get(f"{base}/api/v1/{path}", params=params) as response:
            if response.status != 200:
                return None
            body = await response.json()
    except aiohttp.ClientConnectionError:
        return None  # not listening yet
    assert body["status"] == "success", body
    return body["data"]


async def test_prometheus_scrapes_the_service_and_evaluates_the_shipped_rules(
    service: tuple[str, str, Path], prometheus: str, tmp_path: Path
) -> None:
    base, token, gunicorn_log = service
    deadline = time.monotonic() + DEADLINE_SECONDS
    headers = {"authorization": f"Bearer {token}", "service-type": "ai"}
    async with aiohttp.ClientSession() as session:
        # One completion, so the chat series have samples (and labels) to scrape.
        async with session.post(f"{base}/v1/chat/completions", json=chat_body(), headers=headers) as response:
            assert response.status == 200

        async def scraped_completion() -> list[dict[str, Any]] | None:
            # The counted one: every reason also has a series from start, at zero.
            data = await api(session, prometheus, "query", query=f'mlpa_chat_availability_total{{job="{JOB}"}} > 0')
            return data["result"] if data else None

        (availability,) = await wait_for("a scrape with the completion", scraped_completion, deadline, gunicorn_log)
        labels = availability["metric"]
        assert labels["__name__"] == "mlpa_chat_availability_total" and labels["job"] == JOB
        assert labels["instance"] == base.removeprefix("http://")
        assert {labels["outcome"], labels["model"], labels["service_type"]} == {"success", "gpt-oss-120b", "ai"}
        assert float(availability["value"][1]) == 1.0

        up = await api(session, prometheus, "query", query=f'up{{job="{JOB}"}}')
        assert [float(series["value"][1]) for series in up["result"]] == [1.0]
        requests = await api(session, prometheus, "query", query=f'mlpa_requests_total{{job="{JOB}", endpoint="/v1/chat/completions"}}')
        assert [series["metric"]["method"] for series in requests["result"]] == ["POST"]

        # One process_* series per worker, told apart by pid, whichever worker answered.
        async def both_workers() -> list[dict[str, Any]] | None:
            data = await api(session, prometheus, "query", query=f'process_resident_memory_bytes{{job="{JOB}"}}')
            return data["result"] if data and len(data["result"]) == WORKERS else None

        memory = await wait_for("a process series per worker", both_workers, deadline, gunicorn_log)
        pids = {series["metric"]["pid"] for series in memory}
        assert len(pids) == WORKERS and all(pid.isdigit() for pid in pids)
        assert all(float(series["value"][1]) > 10 * 1024 * 1024 for series in memory)
        booted = set(re.findall(r"Worker ready \(pid: (\d+)\)", gunicorn_log.read_text()))
        assert pids == booted

        # The shipped rules: every group loaded, every rule evaluated without error.
        expected_groups = [line.split(":", 1)[1].strip() for line in RULES.read_text().splitlines() if line.strip().startswith("- name:")]

        async def evaluated_rules() -> list[dict[str, Any]] | None:
            data = await api(session, prometheus, "rules")
            if not data:
                return None
            rules = [rule for group in data["groups"] for rule in group["rules"]]
            if not rules or any(rule["lastEvaluation"].startswith("0001-") for rule in rules):
                return None
            return data["groups"]

        groups = await wait_for("the rules' first evaluation", evaluated_rules, deadline, gunicorn_log)
    assert sorted(group["name"] for group in groups) == sorted(expected_groups)
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == RULES.read_text().count("- record:") + RULES.read_text().count("- alert:")
    unhealthy = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    assert not unhealthy, unhealthy
