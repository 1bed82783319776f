"""Load generator: one asyncio process holding many streaming chat requests.

It must cost as little CPU as possible (the machine has two cores and the service under test
needs them), so each stream is a bare `asyncio.Protocol`: no HTTP client library, no task per
stream once it is open, and received bytes are only counted, never parsed beyond the status
line and the end of the response.

Modes (`python -m tests.bench.loadgen hold|probe ...`):

hold   open --n streams (at most --concurrency still waiting for their first byte at once,
       so the server's listen backlog never overflows), print one JSON line
       {"event": "opened", ...}, then obey commands read from stdin, one per line, each
       answered by one JSON line on stdout:
         stats                 counters (open streams, SSE events and bytes received, ...)
         close_one_by_one GAP  close the open streams one at a time, GAP seconds apart;
                               answers the time.monotonic() of each close, per stream index
         wait_done TIMEOUT     wait until every stream ended (or TIMEOUT), then counters
         exit                  close everything and exit
probe  for each --target, measure time to first response-body byte of sequential fresh
       requests (targets interleaved round by round); prints one JSON line of samples.
burst  offer --n streams evenly spread over --seconds, with no gate (what a reconnect storm
       does), wait for each one's first body byte (at most --first-byte-timeout), print one
       JSON line: per stream its offset from the start and its time to first byte (null if
       lost), then close them all.
rate   while other streams are open elsewhere, keep --concurrency new streams in flight for
       --seconds, each closed at its first body byte and replaced at once: prints the new
       streams admitted per second and their times to first byte.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

CHUNKED_END = b"\r\n0\r\n\r\n"
DONE_MARKER = b"data: [DONE]"


def build_request(port: int, path: str, token: str, content: str) -> bytes:
    body = json.dumps(
        {
            "model": "gpt-oss-120b",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": content}],
        }
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\n"
        "Service-Type: ai\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    ).encode()
    return head + body


class Counters:
    __slots__ = ("open", "peak_open", "events", "bytes", "completed", "errors", "error_samples")

    def __init__(self) -> None:
        self.open = 0
        self.peak_open = 0
        self.events = 0
        self.bytes = 0
        self.completed = 0
        self.errors = 0
        self.error_samples: list[str] = []

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "open": self.open,
            "peak_open": self.peak_open,
            "events": self.events,
            "bytes": self.bytes,
            "completed": self.completed,
            "errors": self.errors,
            "error_samples": self.error_samples,
        }


class StreamConnection(asyncio.Protocol):
    """One streaming request; counts what arrives and notices the end of the response."""

    def __init__(self, index: int, request: bytes, counters: Counters, open_on_headers: bool) -> None:
        self.index = index
        self.request = request
        self.counters = counters
        self.open_on_headers = open_on_headers
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head = b""
        self.in_body = False
        self.tail = b""
        self.done_seen = False
        self.closed_by_us = False
        self.is_open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  (uvloop's is no asyncio.Transport subclass)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            status_line = self.head[: self.head.find(b"\r\n")]
            data = self.head[end + 4 :]
            self.head = b""
            self.in_body = True
            if not status_line.startswith(b"HTTP/1.1 200"):
                self._fail(f"status {status_line.decode(errors='replace')}")
                return
            if self.open_on_headers:
                self._mark_open()
            if not data:
                return
        if not self.is_open:
            self._mark_open()
        counters = self.counters
        counters.bytes += len(data)
        counters.events += data.count(b"\n\n")
        # The end markers may straddle two reads: look at the previous tail too.
        window = self.tail + data
        if not self.done_seen and DONE_MARKER in window:
            self.done_seen = True
        self.tail = window[-16:]
        if self.tail.endswith(CHUNKED_END):
            if self.done_seen:
                counters.completed += 1
            else:
                counters.error("response ended without [DONE]")
            self._finish()

    def _mark_open(self) -> None:
        self.is_open = True
        counters = self.counters
        counters.open += 1
        if counters.open > counters.peak_open:
            counters.peak_open = counters.open
        if not self.opened.done():
            self.opened.set_result(time.monotonic())

    def _fail(self, reason: str) -> None:
        self.counters.error(reason)
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(reason))
        self._finish()

    def _finish(self) -> None:
        if self.is_open:
            self.is_open = False
            self.counters.open -= 1
        if not self.ended.done():
            self.ended.set_result(None)
        if self.transport is not None:
            self.closed_by_us = True
            self.transport.close()

    def close(self) -> float:
        """Close the connection from the client side; returns the monotonic close time."""
        self.closed_by_us = True
        closed_at = time.monotonic()
        if self.transport is not None:
            self.transport.close()
        if self.is_open:
            self.is_open = False
            self.counters.open -= 1
        if not self.ended.done():
            self.ended.set_result(None)
        return closed_at

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            if not self.closed_by_us:
                self._fail(f"connection lost mid-response ({exc!r})")
            else:
                self._finish()
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed before the first byte"))


async def hold(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    counters = Counters()
    connections: list[StreamConnection] = []
    gate = asyncio.Semaphore(args.concurrency)

    async def open_one(index: int) -> None:
        request = build_request(args.port, args.path, args.token, args.content.format(i=index))
        async with gate:
            try:
                _, connection = await loop.create_connection(
                    lambda: StreamConnection(index, request, counters, args.open_on == "headers"),
                    "127.0.0.1",
                    args.port,
                )
            except OSError as exc:
                counters.error(f"connect: {exc!r}")
                return
            connections.append(connection)
            try:
                await asyncio.wait_for(asyncio.shield(connection.opened), args.open_timeout)
            except (ConnectionError, asyncio.TimeoutError) as exc:
                if isinstance(exc, asyncio.TimeoutError):
                    counters.error("no first byte within --open-timeout")

    started = time.monotonic()
    opening = [asyncio.ensure_future(open_one(index)) for index in range(args.n)]
    if opening:
        await asyncio.wait(opening, timeout=args.open_timeout + 5)
    emit({"event": "opened", "seconds": round(time.monotonic() - started, 3), **counters.as_dict()})

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = (await reader.readline()).decode().strip()
        if not line or line == "exit":
            break
        command, *params = line.split()
        if command == "stats":
            emit({"event": "stats", "t": time.monotonic(), **counters.as_dict()})
        elif command == "close_one_by_one":
            gap = float(params[0])
            closes: list[tuple[int, float]] = []
            for connection in connections:
                if connection.is_open:
                    closes.append((connection.index, connection.close()))
                    await asyncio.sleep(gap)
            emit({"event": "closed", "closes": closes})
        elif command == "wait_done":
            pending = [connection.ended for connection in connections if not connection.ended.done()]
            if pending:
                await asyncio.wait(pending, timeout=float(params[0]))
            emit({"event": "done", "unfinished": sum(1 for c in connections if not c.ended.done()), **counters.as_dict()})
        else:
            emit({"event": "error", "message": f"unknown command {line!r}"})
    for connection in connections:
        connection.close()
    emit({"event": "bye"})


async def probe(args: argparse.Namespace) -> None:
    """Sequential fresh requests; time from connect start to the first response-body byte."""
    loop = asyncio.get_running_loop()
    targets = [spec.split(",", 2) for spec in args.target]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in targets}
    failures: dict[str, int] = {name: 0 for name, _, _ in targets}
    for round_index in range(args.count):
        # Alternate the order, so neither target always runs right after the other.
        ordered = targets if round_index % 2 == 0 else list(reversed(targets))
        for name, port_text, token in ordered:
            port = int(port_text)
            request = build_request(port, args.path, token, args.content.format(i=round_index))
            started = time.monotonic()
            connection: StreamConnection | None = None
            try:
                _, connection = await loop.create_connection(
                    lambda: StreamConnection(round_index, request, Counters(), False), "127.0.0.1", port
                )
                first_byte = await asyncio.wait_for(asyncio.shield(connection.opened), 10)
                samples[name].append(first_byte - started)
            except (OSError, asyncio.TimeoutError):
                failures[name] += 1
            finally:
                if connection is not None:
                    connection.close()
            await asyncio.sleep(args.pause)
    emit({"event": "probed", "samples": samples, "failures": failures})


async def burst(args: argparse.Namespace) -> None:
    """Open-loop: stream i is offered at start + i * seconds / n, whatever happened before."""
    loop = asyncio.get_running_loop()
    counters = Counters()
    connections: list[StreamConnection] = []
    offsets: list[float] = []
    ttfb: list[float | None] = [None] * args.n
    failures: dict[str, int] = {}

    async def open_one(index: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        offered = time.monotonic()
        offsets.append(offered - started)
        request = build_request(args.port, args.path, args.token, args.content.format(i=index))
        try:
            async with asyncio.timeout(args.first_byte_timeout):
                _, connection = await loop.create_connection(
                    lambda: StreamConnection(index, request, counters, False), "127.0.0.1", args.port
                )
                connections.append(connection)
                first_byte = await asyncio.shield(connection.opened)
            ttfb[index] = first_byte - offered
        except (OSError, asyncio.TimeoutError) as exc:
            reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
            failures[reason] = failures.get(reason, 0) + 1

    started = time.monotonic()
    begin = loop.time() + 0.05
    spacing = args.seconds / max(args.n, 1)
    await asyncio.gather(*(open_one(index, begin + index * spacing) for index in range(args.n)))
    emit({
        "event": "burst", "n": args.n, "seconds": args.seconds, "offsets": [round(o, 4) for o in offsets],
        "ttfb": [None if t is None else round(t, 5) for t in ttfb], "failures": failures,
        "errors": counters.errors, "error_samples": counters.error_samples,
        "wall_seconds": round(time.monotonic() - started, 3),
    })
    for connection in connections:
        connection.close()


async def admit_rate(args: argparse.Namespace) -> None:
    """Closed-loop: --concurrency workers, each opening a stream, waiting for its first body
    byte, closing it and opening the next, for --seconds."""
    loop = asyncio.get_running_loop()
    counters = Counters()
    ttfb: list[float] = []
    failures: dict[str, int] = {}
    stop_at = time.monotonic() + args.seconds

    async def worker(worker_index: int) -> None:
        index = worker_index
        while time.monotonic() < stop_at:
            request = build_request(args.port, args.path, args.token, args.content.format(i=index))
            offered = time.monotonic()
            connection: StreamConnection | None = None
            try:
                async with asyncio.timeout(args.first_byte_timeout):
                    _, connection = await loop.create_connection(
                        lambda: StreamConnection(index, request, counters, False), "127.0.0.1", args.port
                    )
                    first_byte = await asyncio.shield(connection.opened)
                if first_byte <= stop_at:
                    ttfb.append(first_byte - offered)
            except (OSError, asyncio.TimeoutError) as exc:
                reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
                failures[reason] = failures.get(reason, 0) + 1
            finally:
                if connection is not None:
                    connection.close()
            index += args.concurrency

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))
    elapsed = min(time.monotonic(), stop_at) - started
    emit({"event": "rate", "admitted": len(ttfb), "seconds": round(elapsed, 3),
          "per_second": round(len(ttfb) / elapsed, 1), "ttfb": [round(t, 5) for t in ttfb],
          "failures": failures, "errors": counters.errors, "error_samples": counters.error_samples})


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.loadgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    hold_parser = modes.add_parser("hold")
    hold_parser.add_argument("--port", type=int, required=True)
    hold_parser.add_argument("--n", type=int, required=True)
    hold_parser.add_argument("--concurrency", type=int, default=200)
    hold_parser.add_argument("--open-on", choices=("body", "headers"), default="body")
    hold_parser.add_argument("--open-timeout", type=float, default=120.0)
    probe_parser = modes.add_parser("probe")
    probe_parser.add_argument("--target", action="append", required=True, help="name,port,token")
    probe_parser.add_argument("--count", type=int, default=200)
    probe_parser.add_argument("--pause", type=float, default=0.005)
    burst_parser = modes.add_parser("burst")
    burst_parser.add_argument("--port", type=int, required=True)
    burst_parser.add_argument("--n", type=int, required=True)
    burst_parser.add_argument("--seconds", type=float, default=3.0)
    burst_parser.add_argument("--first-byte-timeout", type=float, default=40.0)
    rate_parser = modes.add_parser("rate")
    rate_parser.add_argument("--port", type=int, required=True)
    rate_parser.add_argument("--concurrency", type=int, default=100)
    rate_parser.add_argument("--seconds", type=float, default=5.0)
    rate_parser.add_argument("--first-byte-timeout", type=float, default=20.0)
    for sub in (hold_parser, probe_parser, burst_parser, rate_parser):
        sub.add_argument("--path", default="/v1/chat/completions")
        sub.add_argument("--token", default="demo-token")
        sub.add_argument("--content", default="hi", help="message content; {i} is the stream index")
    args = parser.parse_args()
    try:
        import uvloop  # noqa: F401  (optional: a cheaper load generator leaves more CPU to the server)

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    modes_run = {"hold": hold, "probe": probe, "burst": burst, "rate": admit_rate}
    runner(modes_run[args.mode](args))


if __name__ == "__main__":
    main()
