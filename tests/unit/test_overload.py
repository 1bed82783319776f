"""Overload protection over real HTTP (mlpa_aiohttp/process/overload.py): real event-loop lag (the
test blocks the loop the app runs on), the open-stream and admission bounds, shedding with
the generic 503 body and Retry-After, readiness flipping and recovering with hysteresis,
and the settings' validation."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp import keys
from mlpa_aiohttp.observability.metrics import Metrics
from mlpa_aiohttp.observability.labels import SHED_REASONS
from mlpa_aiohttp.process.overload import LoadMonitor, accept_queue_length, listening_sockets
from mlpa_aiohttp.settings import OverloadSettings, Settings, SettingsError
from prometheus_client import CollectorRegistry

from ..conftest import TEST_SECRETS, Service, ServiceFactory, chat_body, events, open_streams

# Fast sampling and short holds, so a test sees a flip and its recovery within a second.
FAST = {
    "OVERLOAD_PROTECTION": "true",
    "OVERLOAD_LAG_SAMPLE_MS": "20",
    "OVERLOAD_LAG_ENTER_MS": "150",
    "OVERLOAD_LAG_LEAVE_MS": "40",
    "OVERLOAD_RECOVER_SECONDS": "0.4",
    "OVERLOAD_RETRY_AFTER_SECONDS": "3",
}
# For the bound tests: a loop stall of the test process itself (a full collection late in
# a long run held it 500 ms once) must not make lag the reason they assert on.
BOUNDS_ONLY = {**FAST, "OVERLOAD_LAG_ENTER_MS": "600000"}
SHED_BODY = {"detail": "Service Unavailable"}


async def block_loop(seconds: float) -> None:
    """Hold the event loop the app runs on (the test's own), as a CPU-bound burst would,
    then give the sampler the few wake-ups it needs to notice."""
    time.sleep(seconds)
    await asyncio.sleep(0.06)


class SustainedLag:
    """Blocks the loop for `block` seconds again and again, `gap` apart: a worker kept busy,
    as under a flood of new requests (the requests are served in the gaps)."""

    def __init__(self, block: float = 0.2, gap: float = 0.01) -> None:
        self.block, self.gap = block, gap
        self._handle: asyncio.TimerHandle | None = None

    def _hold(self) -> None:
        time.sleep(self.block)
        self._handle = asyncio.get_running_loop().call_later(self.gap, self._hold)

    async def __aenter__(self) -> "SustainedLag":
        self._handle = asyncio.get_running_loop().call_later(self.gap, self._hold)
        await asyncio.sleep(self.block + 0.1)  # the sampler has seen one late wake-up
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def readiness(service: Service) -> tuple[int, dict[str, Any]]:
    response = await service.client.get("/health/readiness")
    return response.status, await response.json()


# Every reason's series exists from start, at zero (observability/known_series.py).
NOTHING_SHED = dict.fromkeys(SHED_REASONS, 0.0)


def shed_counts(text: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == "mlpa_shed_requests":
            return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}
    return {}


async def scrape(service: Service) -> str:
    response = await service.client.get("/metrics")
    assert response.status == 200
    return await response.text()


async def test_readiness_flips_on_loop_lag_and_recovers_after_the_hold(make_service: ServiceFactory) -> None:
    service = await make_service(**FAST)
    assert (await readiness(service))[0] == 200

    await block_loop(0.3)
    status, body = await readiness(service)
    assert status == 503
    assert body["status"] == "degraded"
    assert body["overload"]["reason"] == "event_loop_lag"
    assert body["overload"]["peak_event_loop_lag_ms"] >= 150
    # The rest of the body keeps today's shape.
    assert {"mlpa_version", "pg_server_dbs", "litellm"} <= body.keys()

    # Not ready again until the lag stayed below the leave bound for the hold (0.4 s).
    calm_from = time.monotonic()
    while (await readiness(service))[0] == 503:
        assert time.monotonic() - calm_from < 3, "readiness never recovered"
        await asyncio.sleep(0.02)
    assert time.monotonic() - calm_from >= 0.4 - 0.05
    status, body = await readiness(service)
    assert status == 200 and "overload" not in body


async def test_lag_between_the_bounds_keeps_the_worker_overloaded(make_service: ServiceFactory) -> None:
    service = await make_service(**FAST)
    await block_loop(0.3)
    # Lag of ~80 ms per sample: below enter (150), above leave (40): no recovery.
    for _ in range(8):
        time.sleep(0.08)
        await asyncio.sleep(0.03)
    status, body = await readiness(service)
    assert status == 503 and body["overload"]["reason"] == "event_loop_lag"


async def test_shedding_answers_503_fast_while_open_streams_keep_streaming(
    make_service: ServiceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    service = await make_service(**FAST)
    # Open for 2 s: longer than the episode and the checks below take on a busy machine
    # (12 chunks, 0.6 s, once ended inside them and wrote its line before the check).
    service.litellm.chunks = 40
    service.litellm.interval = 0.05
    stream = await service.chat(chat_body(stream=True))
    assert stream.status == 200
    first = await stream.content.readline()
    assert first.startswith(b"data: ")
    upstream_calls = len(service.litellm.requests_to("/v1/chat/completions"))

    async with SustainedLag():
        started = time.monotonic()
        shed = await service.chat(chat_body(stream=True))
        elapsed = time.monotonic() - started
        again = await service.chat(chat_body())
        assert again.status == 503
    assert shed.status == 503
    assert await shed.json() == SHED_BODY
    assert shed.headers["Retry-After"] == "3"
    assert shed.headers["Content-Type"].startswith("application/json")
    assert shed.headers.get("Connection", "").lower() == "close"
    assert elapsed < 0.8  # at most a few of the blocks, no auth or upstream wait
    # Shed before any work: LiteLLM saw no new request.
    assert len(service.litellm.requests_to("/v1/chat/completions")) == upstream_calls
    # Probes and the scrape are never shed.
    assert (await service.client.get("/health/liveness")).status == 200
    text = await scrape(service)
    assert shed_counts(text) == {**NOTHING_SHED, "event_loop_lag": 2.0}
    # One WARNING for the episode, no request line per shed request; one INFO at its end.
    [started_line] = events(caplog, "overload_shedding_started")
    assert started_line["level"] == "WARNING" and started_line["reason"] == "event_loop_lag"
    chat_lines = [e for e in events(caplog, "request") if e.get("path") == "/v1/chat/completions"]
    assert [e["status"] for e in chat_lines] == []  # the open stream's line comes at its end
    deadline = time.monotonic() + 2
    while not events(caplog, "overload_shedding_ended"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    [ended] = events(caplog, "overload_shedding_ended")
    assert ended["level"] == "INFO" and ended["shed_requests"] == 2

    # The stream opened before the overload runs to its end.
    rest = await stream.read()
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert rest.count(b"data: ") >= service.litellm.chunks


async def test_open_stream_bound_sheds_new_requests_and_readiness_says_why(make_service: ServiceFactory) -> None:
    service = await make_service(**BOUNDS_ONLY, OVERLOAD_MAX_OPEN_STREAMS="1")
    service.litellm.chunks = 10
    service.litellm.interval = 0.05
    stream = await service.chat(chat_body(stream=True))
    assert stream.status == 200
    await stream.content.readline()
    assert open_streams(service) == 1

    shed = await service.chat(chat_body())
    assert shed.status == 503 and await shed.json() == SHED_BODY
    # The next lag sample sees the bound (samples are 20 ms apart, later on a busy loop).
    deadline = time.monotonic() + 2
    status, body = await readiness(service)
    while status != 503 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        status, body = await readiness(service)
    assert status == 503
    assert body["overload"]["reason"] == "open_streams" and body["overload"]["open_streams"] == 1

    await stream.read()
    # Below the bound again: a new request is served at once.
    deadline = time.monotonic() + 2
    while open_streams(service):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    served = await service.chat(chat_body())
    assert served.status == 200
    assert shed_counts(await scrape(service)) == {**NOTHING_SHED, "open_streams": 1.0}


async def test_admission_bound_counts_requests_until_their_first_byte(make_service: ServiceFactory) -> None:
    service = await make_service(**BOUNDS_ONLY, OVERLOAD_MAX_ADMISSIONS="1")
    monitor = service.app[keys.OVERLOAD]
    # A stream's first response byte is its headers, sent once auth and provisioning are
    # done (before LiteLLM is asked): a slow FxA verification (of an opaque token, which
    # FxA's /v1/verify checks) keeps it an admission.
    service.token = service.fxa.demo_token
    service.fxa.verify_delay = 0.3
    service.litellm.chunks = 6
    service.litellm.interval = 0.1
    waiting = asyncio.ensure_future(service.chat(chat_body(stream=True)))
    deadline = time.monotonic() + 2
    while monitor.admissions == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)

    shed = await service.chat(chat_body())
    assert shed.status == 503 and await shed.json() == SHED_BODY

    stream = await waiting
    assert stream.status == 200
    # Its headers are out: no longer an admission, though the stream is still open.
    assert monitor.admissions == 0 and open_streams(service) == 1
    served = await service.chat(chat_body())
    assert served.status == 200
    await stream.read()
    assert monitor.admissions == 0
    assert shed_counts(await scrape(service)) == {**NOTHING_SHED, "admissions": 1.0}


async def test_off_by_default_nothing_sheds_and_readiness_ignores_lag(service: Service) -> None:
    assert keys.OVERLOAD not in service.app
    await block_loop(0.3)
    assert (await service.chat(chat_body())).status == 200
    status, body = await readiness(service)
    assert status == 200 and "overload" not in body


async def test_a_request_whose_client_left_before_it_was_read_does_no_work(
    make_service: ServiceFactory,
) -> None:
    # A lag bound the block stays under, so the lag does not shed this request first.
    service = await make_service(**{**FAST, "OVERLOAD_LAG_ENTER_MS": "5000"})
    server = service.client.server
    calls_before = len(service.litellm.requests_to("/v1/chat/completions"))
    verifications_before = len(service.fxa.verify_calls)
    body = json.dumps(chat_body(stream=True)).encode()
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {service.token}\r\nService-Type: ai\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    # Leave before the (blocked) service reads the request.
    writer.transport.abort()
    await block_loop(0.3)
    await asyncio.sleep(0.1)
    assert len(service.litellm.requests_to("/v1/chat/completions")) == calls_before
    assert len(service.fxa.verify_calls) == verifications_before
    # aiohttp dropped it before any middleware: nothing was shed either.
    assert shed_counts(await scrape(service)) == NOTHING_SHED


def test_hysteresis_state_machine() -> None:
    settings = Settings.from_environ({**TEST_SECRETS, **FAST}).overload
    monitor = LoadMonitor(settings, lambda: 0, Metrics(CollectorRegistry()))
    monitor.tick(0.01, now=0.0)
    assert monitor.shed_reason() is None and monitor.state() is None
    monitor.tick(0.2, now=1.0)  # above enter (150 ms)
    assert monitor.shed_reason() == "event_loop_lag"
    assert monitor.state() is not None and monitor.state().peak_event_loop_lag_ms == 200.0
    monitor.tick(0.1, now=1.05)  # between the bounds: both hold
    assert monitor.shed_reason() == "event_loop_lag" and monitor.state() is not None
    # Below leave (40 ms): shedding stops at once, readiness waits for the 0.4 s hold.
    monitor.tick(0.02, now=1.1)
    assert monitor.shed_reason() is None
    monitor.tick(0.02, now=1.4)
    assert monitor.state() is not None  # calm for 0.3 s of 0.4
    monitor.tick(0.1, now=1.45)  # between the bounds: the calm restarts; no shedding
    assert monitor.shed_reason() is None
    monitor.tick(0.02, now=1.5)
    monitor.tick(0.02, now=1.85)
    assert monitor.state() is not None
    monitor.tick(0.02, now=1.95)
    assert monitor.state() is None
    assert monitor.shed_reason() is None


def test_open_stream_bound_holds_readiness_for_the_recover_time() -> None:
    settings = Settings.from_environ({**TEST_SECRETS, **FAST, "OVERLOAD_MAX_OPEN_STREAMS": "2"}).overload
    streams = [3]
    monitor = LoadMonitor(settings, lambda: streams[0], Metrics(CollectorRegistry()))
    monitor.tick(0.0, now=0.0)
    assert monitor.shed_reason() == "open_streams"
    streams[0] = 1
    monitor.tick(0.0, now=0.1)
    assert monitor.shed_reason() is None  # shedding follows the bound exactly
    state = monitor.state()
    assert state is not None and state.reason == "open_streams"  # readiness holds
    monitor.tick(0.0, now=0.5)
    assert monitor.state() is None


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"OVERLOAD_LAG_ENTER_MS": "100", "OVERLOAD_LAG_LEAVE_MS": "100"}, "OVERLOAD_LAG_LEAVE_MS: must be below"),
        ({"OVERLOAD_LAG_ENTER_MS": "0.5"}, "OVERLOAD_LAG_ENTER_MS: must be at least 1"),
        ({"OVERLOAD_LAG_SAMPLE_MS": "5"}, "OVERLOAD_LAG_SAMPLE_MS: must be at least 10"),
        ({"OVERLOAD_MAX_OPEN_STREAMS": "-1"}, "OVERLOAD_MAX_OPEN_STREAMS: must be at least 0"),
        ({"OVERLOAD_MAX_ADMISSIONS": "many"}, "OVERLOAD_MAX_ADMISSIONS: expected an integer"),
        ({"OVERLOAD_RECOVER_SECONDS": "-2"}, "OVERLOAD_RECOVER_SECONDS: must be at least 0"),
        ({"OVERLOAD_PROTECTION": "maybe"}, "OVERLOAD_PROTECTION: expected a boolean"),
    ],
)
def test_invalid_settings_are_refused_with_the_variable_named(env: dict[str, str], problem: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_environ({**TEST_SECRETS, **env})
    assert any(line.startswith(problem) for line in caught.value.problems), caught.value.problems


def test_defaults() -> None:
    settings = Settings.from_environ(dict(TEST_SECRETS)).overload
    assert settings == OverloadSettings()
    assert not settings.enabled
    assert (settings.lag_enter_seconds, settings.lag_leave_seconds) == (0.2, 0.05)


def test_accept_queue_is_read_from_a_real_listening_socket() -> None:
    settings = Settings.from_environ({**TEST_SECRETS, **FAST, "OVERLOAD_MAX_ACCEPT_QUEUE": "4"}).overload
    with socket.create_server(("127.0.0.1", 0), backlog=32) as listener:
        monitor = LoadMonitor(settings, lambda: 0, Metrics(CollectorRegistry()), listeners=lambda: [listener])
        monitor.tick(0.0, now=0.0)
        assert monitor.shed_reason() is None and accept_queue_length(listener) == 0
        # The kernel completes these handshakes; nobody accepts them.
        clients = [socket.create_connection(listener.getsockname()) for _ in range(5)]
        try:
            assert accept_queue_length(listener) == 5
            monitor.tick(0.0, now=0.1)
            assert monitor.shed_reason() is None  # one sample over the bound: a burst, perhaps
            monitor.tick(0.0, now=0.15)
            assert monitor.shed_reason() == "accept_queue"  # two in a row: shedding
            state = monitor.state()
            assert state is not None and state.reason == "accept_queue" and state.accept_queue == 5
            for _ in range(3):
                listener.accept()[0].close()
            monitor.tick(0.0, now=0.2)
            assert monitor.shed_reason() is None  # 2 < 4: shedding stops at once
            assert monitor.state() is not None  # readiness holds for the recover time
            # Within the episode (readiness still 503) one sample over the bound sheds again.
            clients += [socket.create_connection(listener.getsockname()) for _ in range(2)]
            monitor.tick(0.0, now=0.3)
            assert monitor.shed_reason() == "accept_queue"
            for _ in range(4):
                listener.accept()[0].close()
            monitor.tick(0.0, now=0.4)
            assert monitor.shed_reason() is None
            monitor.tick(0.0, now=0.9)
            assert monitor.state() is None
            # Calm again: a lone sample over the bound is a burst, not yet an overload.
            clients += [socket.create_connection(listener.getsockname()) for _ in range(4)]
            monitor.tick(0.0, now=1.0)
            assert monitor.shed_reason() is None
        finally:
            for client in clients:
                client.close()


def test_the_process_listening_sockets_are_found() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        found = listening_sockets()
        try:
            assert listener.getsockname() in [sock.getsockname() for sock in found]
        finally:
            for sock in found:
                sock.close()


def test_the_openapi_document_names_every_reason() -> None:
    from mlpa_aiohttp.openapi import build_document

    document = build_document(mock_routes=False)
    overload = document["components"]["schemas"]["Readiness"]["properties"]["overload"]
    assert tuple(overload["properties"]["reason"]["enum"]) == SHED_REASONS
