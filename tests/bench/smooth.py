"""Open streams while new ones arrive: does the worker keep the open streams' events on time?

    PYTHONPATH=. python -m tests.bench.smooth                      # 1,000 open, new at 0, 300, 900/s
    PYTHONPATH=. python -m tests.bench.smooth --rates 0,300 --seconds 10 --baseline-ref main
    PYTHONPATH=. python -m tests.bench.smooth --replot results.json picture.png   # redraw from --json

The service under gunicorn (one worker, default configuration) or `serve`; one paced upstream
(an event every --interval s to every stream, first event after --ttft); --held streams
opened and kept open by one client process (`hold`), which timestamps every event it
receives; then, per rate, a second client process (`offer`) offers new streams open-loop at
R/s for --seconds, each closed at its first body byte. Per phase, in the same run:

* the open streams' inter-event gap minus the upstream's interval (p50, p99, max): how late
  the worker delivered each event;
* the new streams' time to first byte (p50, p99) and how many got none within 10 s;
* the worker's collections by generation and their time (`mlpa_gc_pause_seconds` from
  /metrics), its CPU and its RSS;
* pauses by cause: every event later than --late-ms is matched with the worker's GC
  timeline (tests/bench/gc_timeline, one line per collection, same CLOCK_MONOTONIC): held up
  by a collection of generation 0, 1 or 2 overlapping its lateness, or by something else.

Every process is stopped at the end (tests/bench/procs.py). A run of the defaults takes
about two minutes per target.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .loadgen import Counters, StreamConnection, build_request, emit
from .open_streams import Loadgen, export_tree, percentile, say
from .procs import Processes, raise_open_file_limit, terminate_on_sigterm
from .targets import PYTHON, Target, python_env, start_fake_fxa, start_paced_upstream, start_target

GC_TIMELINE_SITE = Path(__file__).resolve().parent / "gc_timeline"


# ---- the two client processes ------------------------------------------------------------


class TimedStream(asyncio.Protocol):
    """A held stream that timestamps the reads carrying SSE events."""

    def __init__(self, request: bytes, recorder: GapRecorder) -> None:
        self.request = request
        self.recorder = recorder
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.in_body = False
        self.head = b""
        self.last: float | None = None
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self.head.startswith(b"HTTP/1.1 200"):
                self.recorder.errors += 1
                if not self.opened.done():
                    self.opened.set_exception(ConnectionError(self.head[:40].decode(errors="replace")))
                return
            data, self.head, self.in_body = self.head[end + 4 :], b"", True
        events = data.count(b"\n\n")
        if not events:
            return
        if not self.opened.done():
            self.opened.set_result(None)
        if self.last is not None:
            self.recorder.record(now, now - self.last, events)
        self.last = now

    def connection_lost(self, exc: Exception | None) -> None:
        self.recorder.lost += 1
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed before the first event"))


class GapRecorder:
    def __init__(self) -> None:
        self.recording = False
        self.samples: list[tuple[float, float]] = []  # (arrival, gap since the stream's previous event)
        self.coalesced = 0  # events that arrived in the same read as an earlier one
        self.errors = 0
        self.lost = 0

    def record(self, at: float, gap: float, events: int) -> None:
        if self.recording:
            self.samples.append((at, gap))
            self.coalesced += events - 1


async def hold(args: argparse.Namespace) -> None:
    """Open --n streams (--concurrency waiting at once), then obey stdin: `start`, `stop`
    (answers the gaps recorded since `start`), `exit`."""
    loop = asyncio.get_running_loop()
    recorder = GapRecorder()
    gate = asyncio.Semaphore(args.concurrency)
    streams: list[TimedStream] = []

    async def open_one(index: int) -> None:
        request = build_request(args.port, args.path, args.token, f"held-{index}")
        async with gate:
            try:
                _, stream = await loop.create_connection(lambda: TimedStream(request, recorder), "127.0.0.1", args.port)
                streams.append(stream)
                await asyncio.wait_for(asyncio.shield(stream.opened), 60)
            except (OSError, ConnectionError, asyncio.TimeoutError):
                recorder.errors += 1

    started = time.monotonic()
    await asyncio.gather(*(open_one(index) for index in range(args.n)))
    emit({"event": "opened", "seconds": round(time.monotonic() - started, 2), "open": len(streams) - recorder.lost,
          "errors": recorder.errors})
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = (await reader.readline()).decode().strip()
        if not line or line == "exit":
            break
        if line == "start":
            recorder.samples, recorder.coalesced, recorder.recording = [], 0, True
            emit({"event": "started", "t": time.monotonic()})
        elif line == "stop":
            recorder.recording = False
            emit({"event": "gaps", "samples": [(round(a, 6), round(g, 6)) for a, g in recorder.samples],
                  "coalesced": recorder.coalesced, "lost": recorder.lost, "errors": recorder.errors})
    for stream in streams:
        if stream.transport is not None:
            stream.transport.close()


async def offer(args: argparse.Namespace) -> None:
    """Open-loop: stream i offered at start + i / rate for --seconds; closed at its first
    body byte; --first-byte-timeout without one counts it as failed."""
    loop = asyncio.get_running_loop()
    count = int(args.rate * args.seconds)
    ttfb: list[float] = []
    failures: dict[str, int] = {}
    counters = Counters()

    async def one(index: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        request = build_request(args.port, args.path, args.token, f"new-{index}")
        offered = time.monotonic()
        connection: StreamConnection | None = None
        try:
            async with asyncio.timeout(args.first_byte_timeout):
                _, connection = await loop.create_connection(
                    lambda: StreamConnection(index, request, counters, False), "127.0.0.1", args.port
                )
                first = await asyncio.shield(connection.opened)
            ttfb.append(first - offered)
        except (OSError, ConnectionError, asyncio.TimeoutError) as exc:
            reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
            failures[reason] = failures.get(reason, 0) + 1
        finally:
            if connection is not None:
                connection.close()

    begin = loop.time() + 0.05
    await asyncio.gather(*(one(index, begin + index / args.rate) for index in range(count)))
    emit({"event": "offered", "offered": count, "ttfb": [round(t, 5) for t in ttfb], "failures": failures})


# ---- the run ----------------------------------------------------------------------------


def scrape_gc(port: int) -> dict[str, dict[str, float]]:
    """collections and pause seconds per generation, from the worker's /metrics."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        for prefix, key in (("python_gc_collections_total", "collections"), ("mlpa_gc_pause_seconds_sum", "seconds"),
                            ("mlpa_gc_pause_seconds_count", "timed")):
            if line.startswith(prefix + "{"):
                labels, value = line[len(prefix) + 1 :].rsplit("} ", 1)
                generation = labels.split('generation="', 1)[1].split('"', 1)[0]
                found.setdefault(generation, {})[key] = float(value)
    return found


def read_timeline(directory: Path) -> list[tuple[float, float, int]]:
    pauses = []
    for path in directory.glob("gc-*.log"):
        for line in path.read_text().splitlines():
            start, seconds, generation = line.split()
            pauses.append((float(start), float(seconds), int(generation)))
    return sorted(pauses)


def causes(samples: Sequence[tuple[float, float]], interval: float, late: float,
           pauses: Sequence[tuple[float, float, int]]) -> dict[str, Any]:
    """Late events by what overlapped their lateness: the longest collection whose run
    overlapped [arrival - lateness, arrival], by generation, or none."""
    starts = [start for start, _, _ in pauses]

    by_cause: dict[str, list[float]] = {}
    for arrival, gap in samples:
        lateness = gap - interval
        if lateness < late:
            continue
        window_start = arrival - lateness
        index = bisect.bisect_left(starts, window_start - 1.0)  # no pause here lasts a second
        best: tuple[float, int] | None = None
        while index < len(pauses) and pauses[index][0] <= arrival:
            start, seconds, generation = pauses[index]
            if start + seconds >= window_start and seconds >= 0.001 and (best is None or seconds > best[0]):
                best = (seconds, generation)
            index += 1
        cause = f"gen {best[1]} collection" if best else "no collection ≥ 1 ms"
        by_cause.setdefault(cause, []).append(lateness)
    return {cause: {"events": len(values), "p50_ms": 1000 * statistics.median(values), "max_ms": 1000 * max(values)}
            for cause, values in sorted(by_cause.items())}


def pause_table(pauses: Sequence[tuple[float, float, int]], since: float, until: float) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for generation in (0, 1, 2):
        times = [seconds for start, seconds, gen in pauses if gen == generation and since <= start <= until]
        rows[str(generation)] = {
            "count": len(times), "total_ms": 1000 * sum(times),
            "p50_ms": 1000 * statistics.median(times) if times else 0.0, "max_ms": 1000 * max(times, default=0.0),
            "over_10ms": sum(1 for t in times if t >= 0.010),
        }
    return rows


class HeldStreams(Loadgen):
    """The `hold` client process, spoken to with open_streams' line protocol."""

    def __init__(self, procs: Processes, target: Target, n: int) -> None:
        self.procs, self.open_timeout = procs, 90.0
        self.child = procs.start(f"held-{target.name}", [PYTHON, "-m", "tests.bench.smooth", "hold", "--port",
                                                         str(target.port), "--n", str(n), "--token", target.token],
                                 env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.opened = self._read(120)


def run_target(procs: Processes, args: argparse.Namespace, name: str, upstream: int, fxa: int, work_dir: Path,
               baselines: dict[str, Path]) -> dict[str, Any]:
    timeline = work_dir / f"gc-{name.replace('@', '_')}"
    timeline.mkdir()
    os.environ["BENCH_GC_TIMELINE"] = str(timeline)
    try:
        target = start_target(procs, name, upstream_port=upstream, fxa_port=fxa, work_dir=work_dir, baselines=baselines)
    finally:
        del os.environ["BENCH_GC_TIMELINE"]
    held = HeldStreams(procs, target, args.held)
    opened = held.opened
    say(f"  {name}: {opened['open']}/{args.held} held streams open in {opened['seconds']} s "
        f"({opened['errors']} errors); RSS {target.rss_bytes() / 2**20:.1f} MiB")
    time.sleep(args.settle)
    phases = []
    try:
        for rate in args.rates:
            gc_before, cpu_before, rss_before = scrape_gc(target.port), target.runtime_seconds(), target.rss_bytes()
            started = held.command("start")["t"]
            if rate > 0:
                child = procs.start(f"offer-{name}-{rate}",
                                    [PYTHON, "-m", "tests.bench.smooth", "offer", "--port", str(target.port),
                                     "--rate", str(rate), "--seconds", str(args.seconds), "--token", target.token],
                                    env=python_env(), stdout=subprocess.PIPE)
                stdout, _ = child.process.communicate(timeout=args.seconds + 60)
                procs.stop(child)
                offered = json.loads(stdout.decode().strip().splitlines()[-1])
            else:
                time.sleep(args.seconds)
                offered = {"offered": 0, "ttfb": [], "failures": {}}
            gaps = held.command("stop", timeout=60)
            ended = time.monotonic()
            cpu = target.runtime_seconds() - cpu_before
            gc_after, rss_after = scrape_gc(target.port), target.rss_bytes()
            time.sleep(1.5)  # the worker's timeline is flushed at its next collection a second on
            pauses = read_timeline(timeline)
            lateness = [gap - args.interval for _, gap in gaps["samples"]]
            gc_delta = {gen: {key: gc_after.get(gen, {}).get(key, 0.0) - gc_before.get(gen, {}).get(key, 0.0)
                              for key in ("collections", "seconds")} for gen in ("0", "1", "2")}
            phase = {
                "rate": rate, "events": len(lateness), "coalesced": gaps["coalesced"], "held_lost": gaps["lost"],
                "late_p50_ms": 1000 * percentile(lateness, 0.5), "late_p99_ms": 1000 * percentile(lateness, 0.99),
                "late_max_ms": 1000 * max(lateness, default=float("nan")),
                "offered": offered["offered"], "served": len(offered["ttfb"]), "failures": offered["failures"],
                "ttfb_p50_ms": 1000 * percentile(offered["ttfb"], 0.5), "ttfb_p99_ms": 1000 * percentile(offered["ttfb"], 0.99),
                "cpu_percent": 100 * cpu / (ended - started),
                "cpu_us_per_new": 1e6 * cpu / max(1, len(offered["ttfb"])) if rate else None,
                "rss_mib": rss_after / 2**20, "rss_growth_mib": (rss_after - rss_before) / 2**20,
                "gc_metrics": gc_delta, "pauses": pause_table(pauses, started, ended),
                "causes": causes(gaps["samples"], args.interval, args.late_ms / 1000, pauses),
                "load": os.getloadavg()[0],
            }
            phases.append(phase)
            gen = phase["gc_metrics"]
            say(f"  {name:<22} {rate:>4}/s: open streams late p50 {phase['late_p50_ms']:.1f} ms, p99 "
                f"{phase['late_p99_ms']:.1f} ms, max {phase['late_max_ms']:.0f} ms ({phase['events']} events); "
                f"new: {phase['served']}/{phase['offered']} served, TTFB p50 {phase['ttfb_p50_ms']:.0f} ms, p99 "
                f"{phase['ttfb_p99_ms']:.0f} ms {phase['failures'] or ''}; CPU {phase['cpu_percent']:.0f} %; GC "
                + ", ".join(f"gen{g} {gen[g]['collections']:.0f}× {1000 * gen[g]['seconds']:.0f} ms" for g in ("0", "1", "2"))
                + f"; RSS {phase['rss_mib']:.0f} MiB; load {phase['load']:.1f}")
            for cause, row in phase["causes"].items():
                say(f"      late ≥ {args.late_ms:g} ms, {cause}: {row['events']} events, p50 {row['p50_ms']:.0f} ms, "
                    f"max {row['max_ms']:.0f} ms")
            time.sleep(args.settle)
    finally:
        held.close()
        procs.stop(target.child)
    return {"held_opened": opened, "phases": phases}


def write_plot(results: dict[str, Any], path: Path) -> Path:
    """Open streams' lateness (p50, p99, max) and new streams' TTFB p50 against the offered
    rate, one line per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import _style

    figure, (late_axes, ttfb_axes) = plt.subplots(1, 2, figsize=(10, 4))
    for name, result in results.items():
        if name == "args":
            continue
        colour, marker = _style(name)
        rates = [phase["rate"] for phase in result["phases"]]
        late_axes.plot(rates, [phase["late_p99_ms"] for phase in result["phases"]], marker=marker, color=colour,
                       label=f"{name} p99")
        late_axes.plot(rates, [phase["late_max_ms"] for phase in result["phases"]], marker=marker, color=colour,
                       linestyle=":", label=f"{name} max")
        served = [phase for phase in result["phases"] if phase["rate"] > 0]
        ttfb_axes.plot([phase["rate"] for phase in served], [phase["ttfb_p50_ms"] for phase in served], marker=marker,
                       color=colour, label=f"{name} p50")
    late_axes.set_xlabel("new streams offered per second")
    late_axes.set_ylabel("open streams' event lateness, ms")
    late_axes.set_yscale("symlog", linthresh=10)
    late_axes.set_title(f"{results['args']['held']} open streams, an event every {results['args']['interval']} s")
    late_axes.legend(fontsize=7)
    ttfb_axes.set_xlabel("new streams offered per second")
    ttfb_axes.set_ylabel("new streams' time to first byte, ms")
    ttfb_axes.set_yscale("log")
    ttfb_axes.set_title("new streams, closed at their first byte")
    ttfb_axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.smooth", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode")
    hold_parser = modes.add_parser("hold")
    hold_parser.add_argument("--port", type=int, required=True)
    hold_parser.add_argument("--n", type=int, required=True)
    hold_parser.add_argument("--concurrency", type=int, default=200)
    offer_parser = modes.add_parser("offer")
    offer_parser.add_argument("--port", type=int, required=True)
    offer_parser.add_argument("--rate", type=float, required=True)
    offer_parser.add_argument("--seconds", type=float, required=True)
    offer_parser.add_argument("--first-byte-timeout", type=float, default=10.0)
    for sub in (hold_parser, offer_parser):
        sub.add_argument("--path", default="/v1/chat/completions")
        sub.add_argument("--token", default="demo-token")
    parser.add_argument("--targets", default="aiohttp-gunicorn")
    parser.add_argument("--baseline-ref", help="also run each target from this commit's tree, as NAME@REF")
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--rates", default="0,300,900", help="new streams per second, one phase each")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    parser.add_argument("--interval", type=float, default=0.5, help="the upstream's interval between events")
    parser.add_argument("--ttft", type=float, default=0.2, help="the upstream's delay before the first event")
    parser.add_argument("--late-ms", type=float, default=10.0, help="lateness from which an event is attributed")
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path, help="write a PNG of the run here")
    parser.add_argument("--keep-logs", action="store_true", help="keep the directory of process logs and GC timelines")
    parser.add_argument("--replot", nargs=2, type=Path, metavar=("JSON", "PNG"), help="only redraw a saved run")
    args = parser.parse_args(argv)
    if args.replot:
        say(f"picture: {write_plot(json.loads(args.replot[0].read_text()), args.replot[1])}")
        return 0
    if args.mode is not None:
        import uvloop

        uvloop.run({"hold": hold, "offer": offer}[args.mode](args))
        return 0
    args.rates = [float(x) for x in args.rates.split(",") if x.strip()]
    names = [x.strip() for x in args.targets.split(",") if x.strip()]
    if args.baseline_ref:
        names += [f"{name}@{args.baseline_ref}" for name in list(names)]
    terminate_on_sigterm()
    raise_open_file_limit()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-smooth-"))
    os.environ["BENCH_SITE_DIR"] = str(GC_TIMELINE_SITE)
    # Every held stream outlives every phase of every target.
    per_target = len(args.rates) * (args.seconds + args.settle + 8) + 60
    chunks = int(per_target * len(names) / args.interval)
    say(f"# open streams while new ones arrive ({time.strftime('%Y-%m-%d %H:%M')}, load "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.held} held, event every {args.interval} s; "
        f"new streams open-loop at {', '.join(f'{r:g}' for r in args.rates)}/s for {args.seconds:g} s; logs {work_dir})")
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k not in ("json", "plot", "replot")}}
    with Processes(work_dir) as procs:
        fxa = start_fake_fxa(procs)
        upstream = start_paced_upstream(procs, ttft=args.ttft, chunks=chunks, interval=args.interval)
        baselines = {args.baseline_ref: export_tree(args.baseline_ref, work_dir)} if args.baseline_ref else {}
        # Interleaved: target after target, each with every rate, in one upstream's life.
        for name in names:
            results[name] = run_target(procs, args, name, upstream, fxa, work_dir, baselines)
    if not args.keep_logs:  # kept when the run failed (the exception skips this)
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.plot:
        say(f"picture: {write_plot(results, args.plot)}")
    say(f"load at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
