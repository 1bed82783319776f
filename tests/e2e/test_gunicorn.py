"""The production entry under real gunicorn with two aiohttp workers, against loopback fakes
of LiteLLM and FxA served by this test process: streaming, disconnect propagation,
metrics aggregated over workers (compatibility.md D19) and graceful shutdown (compatibility.md D6)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp.observability.metrics import AVAILABILITY_OUTCOME
from tests.support.gunicorn import Gunicorn, gunicorn_on_fakes, wait_until_live

from ..conftest import chat_body

DRAIN_SECONDS = 1
WORKERS = 2
SHUTDOWN_FRAME = b'data: {"code": 503, "error": "Server shutting down"}\n\n'
CHAT_PATH = "/v1/chat/completions"


@pytest.fixture
async def gunicorn(fake_litellm_server, fake_fxa_server, tmp_path) -> AsyncIterator[Gunicorn]:
    metrics_dir = tmp_path / "prometheus"
    async with gunicorn_on_fakes(
        fake_litellm_server, fake_fxa_server, workers=WORKERS, user="e2e-user", log_path=tmp_path / "gunicorn.log",
        metrics_dir=metrics_dir, stop_seconds=15,
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), SHUTDOWN_DRAIN_SECONDS=str(DRAIN_SECONDS),
    ) as server:
        yield server


def requests_per_worker(metrics_dir: Path, endpoint: str) -> dict[int, float]:
    """`mlpa_requests_total{endpoint=...}` as written by each worker process."""
    per_pid: dict[int, float] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            _, sample_name, labels, _ = json.loads(key)
            if sample_name == "mlpa_requests_total" and labels.get("endpoint") == endpoint:
                per_pid[pid] = per_pid.get(pid, 0.0) + value
    return per_pid


def gunicorn_worker_pids(master_pid: int) -> set[int]:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children")
    return {int(pid) for pid in children.read_text().split()} if children.exists() else set()


async def test_streaming_disconnect_and_metrics_across_workers(gunicorn: Gunicorn, fake_litellm_server) -> None:
    fake, _ = fake_litellm_server
    liveness_answered = await wait_until_live(gunicorn)

    # A streaming completion through a real worker.
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gunicorn.base_url}{CHAT_PATH}", data=json.dumps(chat_body(stream=True)), headers=gunicorn.headers()) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
            body = await response.read()
    assert body.endswith(b"data: [DONE]\n\n")
    content = "".join(
        (json.loads(event[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for event in body.decode().split("\n\n")
        if event.startswith("data: {")
    )
    assert content == fake.completion_text()

    # A client that leaves mid-stream: the worker closes the upstream at once.
    fake.interval, fake.chunks = 0.2, 50
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{gunicorn.base_url}{CHAT_PATH}", data=json.dumps(chat_body(stream=True)), headers=gunicorn.headers())
        assert b"data: " in await response.content.readany()
        closed_at = time.monotonic()
        response.close()
    record = fake.requests_to(CHAT_PATH)[-1]
    await asyncio.wait_for(record.disconnected.wait(), 2.0)
    latency = record.disconnected_at - closed_at
    assert latency < 0.05, f"upstream closed {latency * 1000:.1f} ms after the client left"

    # Liveness on fresh connections until both workers have served some.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(400):
            async with session.get(f"{gunicorn.base_url}/health/liveness") as response:
                assert response.status == 200
                liveness_answered += 1
            if len(requests_per_worker(gunicorn.metrics_dir, "/health/liveness")) == 2:
                break
        per_worker = requests_per_worker(gunicorn.metrics_dir, "/health/liveness")
        assert len(per_worker) == 2, f"only {per_worker} served after {liveness_answered} requests"
        assert set(per_worker) == gunicorn_worker_pids(gunicorn.process.pid)

        async with session.get(f"{gunicorn.base_url}/metrics") as response:
            assert response.status == 200
            exposition = await response.text()

    families = {family.name: family for family in text_string_to_metric_families(exposition)}
    liveness = [
        sample.value
        for sample in families["mlpa_requests"].samples
        if sample.name == "mlpa_requests_total" and sample.labels["endpoint"] == "/health/liveness"
    ]
    assert sum(liveness) == liveness_answered == sum(per_worker.values())
    # Every reason has its series from start, at zero (observability/known_series.py).
    availability = dict.fromkeys(AVAILABILITY_OUTCOME, 0.0)
    for sample in families["mlpa_chat_availability"].samples:
        if sample.name == "mlpa_chat_availability_total":
            availability[sample.labels["reason"]] += sample.value
    assert availability == {**dict.fromkeys(AVAILABILITY_OUTCOME, 0.0), "valid_response": 1.0, "client_disconnect": 1.0}


async def read_until(response: aiohttp.ClientResponse, marker: bytes, timeout: float) -> bytes:
    received = b""
    async with asyncio.timeout(timeout):
        async for chunk in response.content.iter_any():
            received += chunk
            if marker in received:
                break
    return received


async def test_sigterm_ends_open_streams_cleanly(gunicorn: Gunicorn, fake_litellm_server) -> None:
    fake, _ = fake_litellm_server
    await wait_until_live(gunicorn)
    fake.interval, fake.chunks = 0.3, 200  # a minute of stream: only shutdown can end it

    sessions = [aiohttp.ClientSession() for _ in range(4)]
    try:
        responses = [
            await session.post(f"{gunicorn.base_url}{CHAT_PATH}", data=json.dumps(chat_body(stream=True)), headers=gunicorn.headers())
            for session in sessions
        ]
        for response in responses:
            assert response.status == 200
            assert b"data: " in await response.content.readany()

        signalled_at = time.monotonic()
        gunicorn.process.send_signal(signal.SIGTERM)
        endings = await asyncio.gather(*(read_until(r, SHUTDOWN_FRAME, timeout=10) for r in responses))
        for ending in endings:
            assert ending.endswith(SHUTDOWN_FRAME), ending[-200:]
        for response in responses:
            assert await response.content.read() == b"", "the stream did not end after the shutdown frame"
        frames_after = time.monotonic() - signalled_at
    finally:
        for session in sessions:
            await session.close()

    exit_code = await asyncio.to_thread(gunicorn.process.wait, 15)
    output = gunicorn.output()
    assert exit_code == 0, output
    # The streams were drained first (a lower bound: the frames cannot come earlier), and
    # the workers stopped inside graceful_timeout (7 s here): gunicorn kills late ones.
    assert frames_after >= DRAIN_SECONDS
    for sign in ("SIGKILL", "WORKER TIMEOUT", "Traceback"):
        assert sign not in output, output
    assert output.count("Worker exiting") == 2, output
    # Every upstream stream was closed.
    for record in fake.requests_to(CHAT_PATH):
        assert record.disconnected.is_set()


PROCESS_SERIES = (
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_cpu_seconds_total",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
)
GC_SERIES = (
    "python_gc_objects_collected_total",
    "python_gc_objects_uncollectable_total",
    "python_gc_collections_total",
    # Ours: time each collection held the worker (observability/runtime_metrics.py, GCPauses).
    "mlpa_gc_pause_seconds_total",
    "mlpa_gc_pauses_total",
)


async def test_process_and_gc_series_of_every_worker(gunicorn: Gunicorn) -> None:
    """An existing dashboard's process_*/python_gc_* queries find both workers, labelled by pid."""
    await wait_until_live(gunicorn)
    workers = {str(pid) for pid in gunicorn_worker_pids(gunicorn.process.pid)}
    assert len(workers) == WORKERS

    # Scrape on fresh connections until both workers have answered one (each scrape also
    # checks that the answering worker reports its sibling), once both apps have started
    # (each has served a liveness request).
    answered_by: set[str] = set()
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(400):
            async with session.get(f"{gunicorn.base_url}/health/liveness") as response:
                assert response.status == 200
            if len(requests_per_worker(gunicorn.metrics_dir, "/health/liveness")) == WORKERS:
                break
        assert len(requests_per_worker(gunicorn.metrics_dir, "/health/liveness")) == WORKERS
        for _ in range(200):
            async with session.get(f"{gunicorn.base_url}/metrics") as response:
                assert response.status == 200
                exposition = await response.text()
            samples = [s for family in text_string_to_metric_families(exposition) for s in family.samples]
            for name in PROCESS_SERIES:
                assert {s.labels.get("pid") for s in samples if s.name == name} == workers, name
            # The worker that answered has its GC counters synced at scrape time; the other
            # one within its sync interval (it synced once at start-up).
            for name in GC_SERIES:
                per_worker = {(s.labels["pid"], s.labels["generation"]) for s in samples if s.name == name}
                assert {pid for pid, _ in per_worker} == workers, name
                assert {generation for _, generation in per_worker} <= {"0", "1", "2"}
            gen0 = {s.labels["pid"]: s.value for s in samples if s.name == "python_gc_collections_total" and s.labels["generation"] == "0"}
            assert all(value > 0 for value in gen0.values()), gen0
            info = [s for s in samples if s.name == "python_info"]
            assert len(info) == 1 and info[0].value == 1 and "pid" not in info[0].labels
            rss = {s.labels["pid"]: s.value for s in samples if s.name == "process_resident_memory_bytes"}
            assert all(value > 10 * 1024 * 1024 for value in rss.values()), rss
            answered_by = {str(pid) for pid in requests_per_worker(gunicorn.metrics_dir, "/metrics")}
            if answered_by == workers:
                break
    assert answered_by == workers, f"only {answered_by} answered a scrape"
