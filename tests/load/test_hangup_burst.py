"""A hang-up is an abort at any load: bursts of ~1,000 concurrent streams whose clients hang
up, against a real `serve` process, over real sockets.

Each run also carries one genuine upstream fault (the fake LiteLLM cuts a stream mid-way):
it must reach the log at ERROR and the fake Sentry, so "no ERROR, no Sentry event" for the
hang-ups cannot pass by the reporting being switched off.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

import pytest

from mlpa_aiohttp.testing.fake_litellm import Scenario
from tests.support.relays import RELAYS, relay_env

from .harness import (
    Fakes,
    HangUp,
    ServiceProcess,
    Verdict,
    error_summary,
    jitter,
    start_fakes,
    start_service,
    stream_client,
    UpstreamWatch,
)

FAULT_ID = "fault-control"
WARM_UP_ID = "warm-up"


async def _settle(service: ServiceProcess, fakes: Fakes, timeout: float = 20.0) -> None:
    """Until the service has no request in progress and no stream open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = await service.metrics()
        in_progress = metrics.get(("mlpa_in_progress_requests", ()), 0)
        if in_progress <= 1 and metrics.get(("mlpa_open_streams", ()), 0) == 0:  # the scrape is in progress
            return
        await asyncio.sleep(0.1)


async def _finish(service: ServiceProcess, fakes: Fakes) -> None:
    """Stop the service (SIGTERM: the Sentry SDK flushes at exit), then give the fake a moment."""
    await asyncio.get_running_loop().run_in_executor(None, service.stop)
    deadline = time.monotonic() + 5
    while not fakes.sentry.events and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


HangUpFor = Callable[[int, UpstreamWatch], "HangUp | None"]


async def _burst(
    tmp_path: Path,
    *,
    clients: int,
    hang_up_for: HangUpFor,
    litellm: dict,
    spread_seconds: float = 1.0,
    relay: str = "regular",
    scenario: Scenario | None = None,
) -> tuple[list, Verdict, dict, Fakes]:
    """`clients` streams started over `spread_seconds`, each hanging up as `hang_up_for` says
    (their chat asks the fake LiteLLM for `scenario`, if given), plus the fault control;
    returns the clients' results, the service's log and metrics."""
    fakes = await start_fakes(**litellm)
    service = await start_service(fakes, tmp_path, **relay_env(relay))
    phases = {}
    try:
        started = time.monotonic()
        # Warm-up (a hang-up at the first byte): the FxA token is cached and the user
        # provisioned before the burst.
        warm = await stream_client(WARM_UP_ID, service.port, HangUp(after_bytes=1))
        assert warm.status == 200 and warm.hung_up, warm
        rng = jitter(clients)
        async with UpstreamWatch(fakes) as watch:

            async def client(index: int):
                await asyncio.sleep(rng.uniform(0, spread_seconds))
                request_id = f"hangup-{index}"
                hang_up = hang_up_for(index, watch)
                # The request id stays the content's last word: the fakes' records are found by it.
                marker = f"[fake:{scenario}] " if scenario is not None else ""
                return await stream_client(request_id, service.port, hang_up, content=f"Hello {marker}{request_id}")

            control = asyncio.ensure_future(
                stream_client(FAULT_ID, service.port, None, content="Hello [fake:mid_stream_error]")
            )
            phases["warm_up_s"] = round(time.monotonic() - started, 1)
            results = await asyncio.gather(*(client(i) for i in range(clients)))
            await control
        phases["burst_s"] = round(time.monotonic() - started, 1)
        await _settle(service, fakes)
        phases["settled_s"] = round(time.monotonic() - started, 1)
        availability = await service.availability()
    finally:
        await _finish(service, fakes)
        await fakes.close()
    phases["stopped_s"] = round(time.monotonic() - started, 1)
    print(f"\nphases: {phases}")
    verdict = Verdict.of(service.log_events())
    return results, verdict, {"availability": availability}, fakes


def _assert_hang_ups_are_aborts(results, verdict: Verdict, figures: dict, fakes: Fakes, *, allow_success: bool = False):
    ids = [r.request_id for r in results]
    hung_up = [r for r in results if r.hung_up]
    not_connected = [r for r in results if r.error and r.error.startswith("connect")]
    assert not not_connected, f"{len(not_connected)} clients could not connect: {not_connected[:3]}"
    outcomes = verdict.results(ids)
    availability = figures["availability"]
    print(f"\nclients={len(results)} hung_up={len(hung_up)} outcomes={dict(outcomes)} availability={dict(availability)}")

    # One canonical line per request, the control and the warm-up included.
    assert verdict.not_exactly_one_line(ids + [FAULT_ID, WARM_UP_ID]) == []
    # The control is the only failure, the only ERROR and the only Sentry event.
    assert verdict.canonical[FAULT_ID][0]["result"] == "error"
    errors = [e for e in verdict.errors if e.get("request_id") != FAULT_ID]
    assert errors == [], f"{len(errors)} ERROR lines for hang-ups: {error_summary(errors)}"
    assert [e.get("event") for e in verdict.errors] == ["upstream_stream_failed"]
    assert availability["failure"] == 1, availability
    assert len(fakes.sentry.events) == 1, [e.get("exception") for e in fakes.sentry.events[:3]]
    # Every hang-up is an abort (a client that hung up after the relay had written its
    # last byte may have been served in full: that is a success, never an error).
    if allow_success:
        assert outcomes["abort"] + outcomes["success"] == len(ids), outcomes
        assert outcomes["abort"] > 0, outcomes
    else:
        assert len(hung_up) == len(ids)
        assert outcomes["abort"] == len(ids), outcomes
    # The warm-up hung up after its first byte: an abort, or, when the relay had already
    # written the whole stream (the large burst), a success.
    warm_up = verdict.canonical[WARM_UP_ID][0]["result"]
    assert warm_up in ("abort", "success")
    assert availability["abort"] == outcomes["abort"] + (warm_up == "abort")
    for event in (verdict.canonical[r.request_id][0] for r in results):
        if event["result"] == "abort":
            assert event["event"] == "client_disconnected"
            assert event["disconnect_reason"] in ("client_closed", "client_reset"), event


def _upstream_record(fakes: Fakes, request_id: str):
    for record in fakes.litellm.requests_to("/v1/chat/completions"):
        if str(record.json["messages"][-1]["content"]).endswith(f" {request_id}"):
            return record
    return None


def _assert_upstreams_closed(results, verdict: Verdict, fakes: Fakes) -> None:
    """Every aborted stream's upstream request was closed by the service (not left to finish)."""
    aborted = [r.request_id for r in results if verdict.canonical[r.request_id][0]["result"] == "abort"]
    records = {rid: _upstream_record(fakes, rid) for rid in aborted}
    still_open = [rid for rid, record in records.items() if record is not None and not record.disconnected.is_set()]
    assert still_open == [], f"{len(still_open)} aborted streams left their upstream open"


@pytest.mark.parametrize("relay", RELAYS)
async def test_hang_ups_mid_stream_are_aborts(tmp_path, relay: str):
    """1,000 streams that only the service can end (the fake's endless scenario, an event
    every 50 ms); each client hangs up 0.05-1.5 s after its first byte (half with a FIN,
    half with an RST). Each must be an abort however late a starved loop reads the hang-up:
    a stream with an end could be relayed in full first (seen after loop stalls of 8 s)."""
    rng = jitter(7)
    results, verdict, figures, fakes = await _burst(
        tmp_path,
        clients=1000,
        hang_up_for=lambda i, _: HangUp(after_seconds=rng.uniform(0.05, 1.5), reset=i % 2 == 1),
        litellm={"ttft": 0.05, "chunks": 200, "interval": 0.05},
        relay=relay,
        scenario=Scenario.ENDLESS,
    )
    _assert_hang_ups_are_aborts(results, verdict, figures, fakes)
    _assert_upstreams_closed(results, verdict, fakes)


async def test_hang_ups_during_ttft_are_aborts(tmp_path):
    """300 clients hang up 0-0.5 s after LiteLLM got their request, before its first byte."""
    rng = jitter(11)
    results, verdict, figures, fakes = await _burst(
        tmp_path,
        clients=300,
        hang_up_for=lambda i, watch: HangUp(
            after_seconds=rng.uniform(0, 0.5), reset=i % 2 == 1, upstream_seen=watch.event(f"hangup-{i}")
        ),
        litellm={"ttft": 2.0, "chunks": 5, "interval": 0.01},
    )
    _assert_hang_ups_are_aborts(results, verdict, figures, fakes)
    _assert_upstreams_closed(results, verdict, fakes)


@pytest.mark.parametrize("relay", RELAYS)
async def test_hang_ups_during_a_large_burst_are_aborts(tmp_path, relay: str):
    """300 clients on slow links (8 KiB receive buffers) hang up after 64 KiB while the
    upstream sends 1.3 MB in one go. The relay is often waiting for the client's transport
    to drain when the hang-up comes (an abort); when it has already handed the last byte to
    the kernel, the stream was relayed in full (a success). Never an error."""
    results, verdict, figures, fakes = await _burst(
        tmp_path,
        clients=300,
        hang_up_for=lambda i, _: HangUp(after_bytes=64 * 1024, reset=i % 2 == 1, receive_buffer=8192),
        litellm={"ttft": 0.05, "chunks": 8000, "interval": 0.0},
        relay=relay,
    )
    _assert_hang_ups_are_aborts(results, verdict, figures, fakes, allow_success=True)


async def test_hang_ups_at_the_final_frame_are_aborts(tmp_path):
    """300 clients hang up around the moment the final frame (finish_reason, [DONE]) comes,
    1.0 s after the first byte: a client whose final frame was written before its hang-up
    was noticed has been served in full (a success); the others are aborts."""
    rng = jitter(13)
    results, verdict, figures, fakes = await _burst(
        tmp_path,
        clients=300,
        hang_up_for=lambda i, _: HangUp(after_seconds=rng.uniform(0.9, 1.1), reset=i % 2 == 1),
        litellm={"ttft": 0.05, "chunks": 20, "interval": 0.05},
    )
    _assert_hang_ups_are_aborts(results, verdict, figures, fakes, allow_success=True)
