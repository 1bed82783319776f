"""The race at its smallest: one client resets its connection while the relay is writing a
large burst. The write that meets the reset closes the client's transport; the relay's next
write, in the same loop step, finds it closing before connection_lost has run. Before the
fix this single hang-up was logged as `upstream_stream_failed` (ClientConnectionResetError).
In-process (pytest-aiohttp's server), so it is quick and runs with the unit tests' fixtures."""

from __future__ import annotations

import asyncio

import pytest

from ..conftest import Service, events
from .harness import HangUp, stream_client


@pytest.mark.parametrize("attempt", range(3))
async def test_a_reset_during_a_large_burst_is_an_abort(service: Service, caplog, attempt: int) -> None:
    service.litellm.chunks, service.litellm.interval = 8000, 0.0  # 1.3 MB in one write
    port = service.client.server.port
    result = await stream_client("reset-in-burst", port, HangUp(after_bytes=1, reset=True), content="Hello")
    assert result.hung_up and result.status == 200
    for _ in range(200):
        if events(caplog, "client_disconnected") or events(caplog, "request"):
            break
        await asyncio.sleep(0.01)
    assert events(caplog, "upstream_stream_failed") == []
    lines = [e for e in events(caplog) if e.get("logger") == "mlpa_aiohttp.request" and e.get("request_id") == "reset-in-burst"]
    assert len(lines) == 1
    # All 1.3 MB may have fitted into the kernel's buffers before the reset (a success);
    # otherwise the hang-up is an abort that says how the client left.
    assert lines[0]["result"] in ("abort", "success")
    if lines[0]["result"] == "abort":
        assert lines[0]["disconnect_reason"] == "client_reset"
