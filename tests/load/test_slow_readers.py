"""Slow readers stay bounded: clients that stop reading while LiteLLM has 48 MiB to send
must not make the service buffer it. The relay awaits each client write, which waits while
the client's transport is above its high-water mark; meanwhile the upstream response's
reader fills to its own limit and pauses reading the upstream socket, so the rest waits in
LiteLLM (here: the fake) and the kernel, not in this process.

    python -m pytest -s tests/load/test_slow_readers.py     # prints the figures
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from tests.support.relays import RELAYS, relay_env
from .harness import chat_request, open_client_connection, start_fakes, start_service, stream_client

STALLED = 4
UPSTREAM_BYTES = 48 * 2**20
# What one stalled stream may hold in the service's memory: the upstream reader's limit
# (2 x 16 KiB, plus one socket read of up to 256 KiB past it), the client transport's
# high-water mark (64 KiB) plus the chunk that crossed it, and allocator slack. Measured:
# about 0.6 MiB (2 MiB with aiohttp's default reader limit; docs/scaling.md, "Slow readers").
BOUND_PER_STREAM = 2**20


def socket_memory(service_port: int, upstream_port: str) -> str:
    """What the kernel holds for the stalled streams (ss's skmem: queued receive and send
    bytes), client side (service port) and upstream side, per stalled stream; best effort."""
    try:
        output = subprocess.run(["ss", "-tmnH", "state", "established"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "n/a (no ss)"
    client_send = upstream_receive = 0
    lines = output.splitlines()
    for index, line in enumerate(lines):
        fields = line.split()
        if len(fields) < 4 or index + 1 >= len(lines) or "skmem:" not in lines[index + 1]:
            continue
        local, peer = fields[2], fields[3]
        skmem = dict(
            (item[0], int(item[1:])) for item in lines[index + 1].split("skmem:(")[1].split(")")[0].split(",")
            if item[:1] in ("r", "w") and item[1:].isdigit()
        )
        if local.endswith(f":{service_port}"):
            client_send += skmem.get("w", 0)
        elif peer.endswith(f":{upstream_port}"):
            upstream_receive += skmem.get("r", 0)
    return (
        f"send queue towards the client {client_send / STALLED / 2**20:.2f} MiB, "
        f"receive queue from LiteLLM {upstream_receive / STALLED / 2**20:.2f} MiB"
    )


@pytest.mark.parametrize("relay", RELAYS)
async def test_stalled_clients_do_not_grow_memory(tmp_path, relay: str):
    event_size = 160  # each fake content event is ~160 bytes
    fakes = await start_fakes(ttft=0.05, chunks=UPSTREAM_BYTES // event_size, interval=0.0)
    service = await start_service(fakes, tmp_path, **relay_env(relay))
    writers = []
    try:
        # Warm-up: the service's own first-request allocations do not count.
        warm = await stream_client("slow-warm-up", service.port, None, content="Hello [fake:empty_stream]")
        assert warm.complete, warm
        await asyncio.sleep(0.5)
        before = service.rss_bytes()
        for index in range(STALLED):
            reader, writer = await open_client_connection("127.0.0.1", service.port, receive_buffer=8192)
            writer.write(chat_request(f"slow-{index}", host="127.0.0.1"))
            await reader.readuntil(b"\r\n\r\n")
            await reader.read(1024)  # it started, then it stops reading
            writers.append(writer)
        # Long enough for an unbounded relay to have buffered everything.
        peak = before
        for _ in range(10):
            await asyncio.sleep(0.25)
            peak = max(peak, service.rss_bytes())
        first_half = peak
        for _ in range(10):
            await asyncio.sleep(0.25)
            peak = max(peak, service.rss_bytes())
        per_stream = (peak - before) / STALLED
        kernel = socket_memory(service.port, fakes.litellm_url.rpartition(":")[2])
        upstream_sent = sum(1 for r in fakes.litellm.requests_to("/v1/chat/completions") if r.started_at)
        print(
            f"\nstalled streams: {STALLED}, upstream body {UPSTREAM_BYTES / 2**20:.0f} MiB each; "
            f"service RSS {before / 2**20:.1f} -> peak {peak / 2**20:.1f} MiB: "
            f"{per_stream / 2**20:.2f} MiB per stalled stream (bound {BOUND_PER_STREAM / 2**20:.0f} MiB); "
            f"kernel socket buffers per stalled stream: {kernel}"
        )
        assert upstream_sent >= STALLED
        assert per_stream <= BOUND_PER_STREAM
        # Levelled off: the second 2.5 s added (next to) nothing.
        assert peak - first_half <= 2**20
    finally:
        for writer in writers:
            writer.close()
        await asyncio.to_thread(service.stop)
        await fakes.close()
