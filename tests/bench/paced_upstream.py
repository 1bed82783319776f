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

Other paths get `{}` (the service creates LiteLLM customers on first sight).
Events have the fake LiteLLM's shape: a role delta, N content deltas, a finish delta, a usage
event (`stream_options.include_usage`) and `data: [DONE]`, HTTP/1.1 chunked, keep-alive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
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
        self._schedule()

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
        if not self.finished:
            self.server.record_lost(self.stream_id, time.monotonic())


class PacedServer:
    def __init__(self, ttft: float, chunks: int, interval: float, lost_log: IO[str] | None) -> None:
        self.ttft = ttft
        self.interval = interval
        self.role, self.body, self.tail = build_events(chunks)
        self.lost_log = lost_log

    def record_lost(self, stream_id: int, at: float) -> None:
        if self.lost_log is not None:
            self.lost_log.write(f"{stream_id} {at:.9f}\n")
            self.lost_log.flush()


async def serve(args: argparse.Namespace) -> None:
    lost_log = open(args.lost_log, "a", buffering=1) if args.lost_log else None
    server = PacedServer(args.ttft, args.chunks, args.interval, lost_log)
    loop = asyncio.get_running_loop()
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
