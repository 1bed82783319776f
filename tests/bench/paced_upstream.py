"""A minimal, instrumented OpenAI-style SSE upstream for two benchmarks.

Why not the project's fake LiteLLM for these:

* disconnect latency needs the moment the upstream's TCP connection closes, taken with
  time.monotonic() (CLOCK_MONOTONIC is shared by all processes on Linux) in the upstream's
  own `connection_lost`, per stream. This server writes `<stream id> <monotonic time>` to
  --lost-log for every connection that closes before its response finished. The stream id
  is the number in `bench-stream-<n>` in the request body (the service forwards bodies).
* per-chunk cost runs 10,000 events/s; a bare asyncio.Protocol with one timer per stream
  paces that for a fraction of an aiohttp handler's CPU, leaving the second core to the
  service under test.

* instructions per event (tests/bench/instructions.py) need events that arrive only while
  the count is on, each in a read of its own: with --held-events K every stream gets its
  role delta and then waits; each SIGUSR1 sends K content deltas to every waiting stream,
  taking the streams in turn, one write per --held-gap seconds (a chain of timers: a late
  one delays the rest, never bunches them, and a stream's next event is N writes later).
  The streams never end by themselves.

Other paths get `{}` (the service creates LiteLLM customers on first sight).
Events have the fake LiteLLM's shape: a role delta, N content deltas, a finish delta, a usage
event (`stream_options.include_usage`) and `data: [DONE]`, HTTP/1.1 chunked, keep-alive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from typing import IO

STREAM_ID = re.compile(rb"bench-stream-(\d+)")
RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream; charset=utf-8\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"\r\n"
)
SMALL_JSON_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
_PREFIX = '{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-oss-120b","choices":'


def _event(choices: list[dict[str, object]], usage: dict[str, int] | None = None) -> bytes:
    tail = "" if usage is None else ',"usage":' + json.dumps(usage, separators=(",", ":"))
    return f"data: {_PREFIX}{json.dumps(choices, separators=(',', ':'))}{tail}}}\n\n".encode()


def _chunk(payload: bytes) -> bytes:
    # One HTTP chunk per SSE event, as LiteLLM (and the fake) write them.
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def build_events(chunks: int) -> tuple[bytes, list[bytes], bytes]:
    role = _chunk(_event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
    words = ("Hello", " from", " the", " paced", " upstream", ".")
    contents = [
        _chunk(_event([{"index": 0, "delta": {"content": words[i % len(words)]}, "finish_reason": None}]))
        for i in range(len(words))
    ]
    body = [contents[i % len(contents)] for i in range(chunks)]
    tail = (
        _chunk(_event([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        + _chunk(_event([], {"prompt_tokens": 7, "completion_tokens": chunks, "total_tokens": 7 + chunks}))
        + _chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )
    return role, body, tail


class PacedStream(asyncio.Protocol):
    def __init__(self, server: PacedServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.stream_id = -1
        self.sent = 0
        self.timer: asyncio.TimerHandle | None = None
        self.finished = True  # no response in progress

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  (uvloop's is no asyncio.Transport subclass)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = 0
        for line in self.buffer[:end].lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line[15:])
        if len(self.buffer) < end + 4 + length:
            return
        request_line = self.buffer[: self.buffer.find(b"\r\n")]
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        assert self.transport is not None
        if b" /v1/chat/completions " not in request_line:
            # The service's other calls (customer creation on first sight of a user): a
            # small JSON answer, as LiteLLM gives, is all it needs.
            self.transport.write(SMALL_JSON_RESPONSE)
            return
        match = STREAM_ID.search(body)
        self.stream_id = int(match.group(1)) if match else -1
        self.sent = 0
        self.finished = False
        self.transport.write(RESPONSE_HEAD)
        self.timer = asyncio.get_running_loop().call_later(self.server.ttft, self._send_role)

    def _send_role(self) -> None:
        assert self.transport is not None
        self.transport.write(self.server.role)
        if self.server.held is not None:
            self.timer = None
            self.server.held.add(self)
            return
        self._schedule()

    def send_held_event(self, event: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(event)

    def _schedule(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.server.interval, self._send_next)

    def _send_next(self) -> None:
        assert self.transport is not None
        body = self.server.body
        if self.sent < len(body):
            self.transport.write(body[self.sent])
            self.sent += 1
            self._schedule()
        else:
            self.transport.write(self.server.tail)
            self.finished = True
            self.timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.server.held is not None:
            self.server.held.discard(self)
        if not self.finished:
            self.server.record_lost(self.stream_id, time.monotonic())


class PacedServer:
    def __init__(
        self, ttft: float, chunks: int, interval: float, lost_log: IO[str] | None,
        held_events: int = 0, held_gap: float = 0.0,
    ) -> None:
        self.ttft = ttft
        self.interval = interval
        self.role, self.body, self.tail = build_events(chunks)
        self.lost_log = lost_log
        # --held: the streams past their role delta, waiting for a SIGUSR1.
        self.held: set[PacedStream] | None = set() if held_events else None
        self.held_events = build_events(held_events)[1]
        self.held_gap = held_gap
        self._pass: Iterator[tuple[PacedStream, bytes]] | None = None

    def release_held(self) -> None:
        """SIGUSR1: --held-events content deltas to every waiting stream, in turns."""
        if self.held is None or self._pass is not None:
            return
        streams = list(self.held)
        self._pass = ((stream, event) for event in self.held_events for stream in streams)
        self._next_held()

    def _next_held(self) -> None:
        assert self._pass is not None
        step = next(self._pass, None)
        if step is None:
            self._pass = None
            return
        stream, event = step
        stream.send_held_event(event)
        asyncio.get_running_loop().call_later(self.held_gap, self._next_held)

    def record_lost(self, stream_id: int, at: float) -> None:
        if self.lost_log is not None:
            self.lost_log.write(f"{stream_id} {at:.9f}\n")
            self.lost_log.flush()


async def serve(args: argparse.Namespace) -> None:
    lost_log = open(args.lost_log, "a", buffering=1) if args.lost_log else None
    server = PacedServer(args.ttft, args.chunks, args.interval, lost_log, args.held_events, args.held_gap)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, server.release_held)
    # --reuse-port: several processes share the port (the kernel spreads connections), so one
    # upstream can hold more connections than one process has file descriptors.
    listener = await loop.create_server(lambda: PacedStream(server), "127.0.0.1", args.port, backlog=4096,
                                        reuse_port=args.reuse_port)
    print(f"paced upstream on 127.0.0.1:{args.port}", flush=True)
    async with listener:
        await listener.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.paced_upstream", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft", type=float, default=0.2)
    parser.add_argument("--chunks", type=int, default=30)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--reuse-port", action="store_true", help="bind with SO_REUSEPORT")
    parser.add_argument("--lost-log", help="file receiving '<stream id> <monotonic>' per early close")
    parser.add_argument("--held-events", type=int, default=0,
                        help="hold every stream after its role delta; each SIGUSR1 sends this many content deltas to each")
    parser.add_argument("--held-gap", type=float, default=0.005, help="seconds between two writes of a SIGUSR1's pass")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args))
    except ImportError:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
