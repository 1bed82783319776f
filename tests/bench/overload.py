"""Overload benchmark (issue 24 item 4): the service with and without overload protection,
in one run, under the issue's workload.

    PYTHONPATH=. python -m tests.bench.overload                       # ~3-4 min, both modes once
    PYTHONPATH=. python -m tests.bench.overload --runs 2 --seconds 20 --rate 1200 --json overload.json
    PYTHONPATH=. python -m tests.bench.plots overload.json docs/      # the pictures

Per mode (a fresh gunicorn, one worker, each time; modes interleaved run by run):
1. --streams streams (default 1,000) open to a paced upstream sending one event every
   --interval s (0.5); a window of --baseline s measures their inter-event delay quietly;
2. new streams offered open-loop at --rate per second for --seconds s (default: twice the
   rate the worker sustains, measured first with those streams open), each closed at its
   first body byte, or at a 503, or given up after --give-up s;
3. measured: the open streams' inter-event delay over the upstream's interval (p50, p99,
   max) before and during the offer; the new streams' outcomes: served, shed fast (a 503
   within 2 s), failed slowly (anything else: no answer within --give-up s, reset, a 503
   after 2 s, another status), their time to first byte (served) or to the 503 (shed);
   the kernel's ListenOverflows (the whole network namespace's, so other tenants' too);
   the worker's CPU; the load average.

The client roles are this module's own subcommands, each its own uvloop process:
`timed-hold` (the open streams; it timestamps every event) and `offer` (the new streams).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from .loadgen import CHUNKED_END, build_request
from .open_streams import tcp_ext_counters
from .procs import Processes, raise_open_file_limit, terminate_on_sigterm
from .targets import PYTHON, Target, environment_assignments, python_env, start_fake_fxa, start_paced_upstream, start_target

SHED_FAST_SECONDS = 2.0
# The protection's settings in the "on" mode (the documented defaults but the switch).
PROTECTION_ON = {"OVERLOAD_PROTECTION": "true"}


def percentile(values: Sequence[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


# ---- the open streams, timestamping each event ------------------------------------------


class TimedStream(asyncio.Protocol):
    """One open stream; records (arrival, gap since the previous event) for each event."""

    def __init__(self, request: bytes, gaps: list[tuple[float, float]], state: dict[str, int]) -> None:
        self.request = request
        self.gaps = gaps
        self.state = state
        self.opened = asyncio.get_running_loop().create_future()
        self.in_body = False
        self.head = b""
        self.last_event: float | None = None
        self.partial = 0  # bytes of an event not yet ended by a blank line
        self.tail = b""
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
                self._settle(False)
                return
            data = self.head[end + 4 :]
            self.in_body = True
            self.head = b""
        window = self.tail + data
        events = window.count(b"\n\n") - self.tail.count(b"\n\n")
        self.tail = window[-8:]
        if events and not self.opened.done():
            self._settle(True)
        for _ in range(events):
            if self.last_event is not None:
                self.gaps.append((now, now - self.last_event))
            self.last_event = now
        if window.endswith(CHUNKED_END):
            self.state["ended"] += 1

    def _settle(self, ok: bool) -> None:
        if not self.opened.done():
            self.opened.set_result(ok)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.in_body:
            self.state["lost"] += 1
        self._settle(False)


async def timed_hold(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    gaps: list[tuple[float, float]] = []
    state = {"failed": 0, "lost": 0, "ended": 0, "retried": 0}
    gate = asyncio.Semaphore(200)
    streams: list[TimedStream] = []

    async def open_one(index: int) -> None:
        # A protected worker sheds some of these opens (the opening wave lags its loop too):
        # try again, as a client would after Retry-After, until the stream is open.
        request = build_request(args.port, "/v1/chat/completions", args.token, f"hold-{index}")
        deadline = loop.time() + 60
        while loop.time() < deadline:
            async with gate:
                try:
                    _, stream = await loop.create_connection(
                        lambda: TimedStream(request, gaps, state), "127.0.0.1", args.port
                    )
                    if await asyncio.wait_for(asyncio.shield(stream.opened), 30):
                        streams.append(stream)
                        return
                except (OSError, asyncio.TimeoutError):
                    pass
            state["retried"] += 1
            await asyncio.sleep(0.5)
        state["failed"] += 1

    started = time.monotonic()
    await asyncio.gather(*(open_one(i) for i in range(args.n)))
    emit({"event": "opened", "seconds": round(time.monotonic() - started, 2),
          "open": len(streams), **state})
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = (await reader.readline()).decode().split()
        if not line or line[0] == "exit":
            break
        if line[0] == "now":
            emit({"event": "now", "t": time.monotonic()})
        elif line[0] == "delays":
            # Inter-event delay over the upstream's interval, for events that arrived in [t0, t1].
            t0, t1, interval = (float(x) for x in line[1:4])
            delays = [gap - interval for at, gap in gaps if t0 <= at <= t1]
            emit({"event": "delays", "count": len(delays), "p50": percentile(delays, 0.5),
                  "p99": percentile(delays, 0.99), "max": max(delays) if delays else None, **state,
                  "histogram": _histogram(delays)})
    for stream in streams:
        if stream.transport is not None:
            stream.transport.close()


def _histogram(delays: list[float]) -> dict[str, int]:
    """Counts per 10 ms bucket of delay (for the picture), bounded to 2 s."""
    counts: dict[str, int] = {}
    for delay in delays:
        bucket = str(min(200, max(-10, int(delay * 100))) * 10)
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts


# ---- the new streams, offered open-loop ---------------------------------------------------


class OfferedStream(asyncio.Protocol):
    """One new stream: settles with ("served" | "shed" | "status NNN", monotonic time) at
    its first body byte or its non-200 status line, then closes."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.done: asyncio.Future[tuple[str, float]] = asyncio.get_running_loop().create_future()
        self.head = b""
        self.in_body = False
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        now = time.monotonic()
        if not self.in_body:
            self.head += data
            line_end = self.head.find(b"\r\n")
            if line_end < 0:
                return
            status = self.head[9:12]
            if status == b"503":
                self._finish("shed", now)
                return
            if status != b"200":
                self._finish(f"status {status.decode(errors='replace')}", now)
                return
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.in_body = True
            data = self.head[end + 4 :]
        if data:
            self._finish("served", now)

    def _finish(self, outcome: str, at: float) -> None:
        if not self.done.done():
            self.done.set_result((outcome, at))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(("reset" if exc is not None else "closed", time.monotonic()))


async def offer(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    results: list[tuple[float, str, float]] = []  # (offset, outcome, seconds waited)
    started = time.monotonic()
    begin = loop.time() + 0.05
    count = int(args.rate * args.seconds)
    spacing = 1 / args.rate

    async def offer_one(index: int) -> None:
        await asyncio.sleep(max(0.0, begin + index * spacing - loop.time()))
        offered = time.monotonic()
        request = build_request(args.port, "/v1/chat/completions", args.token, f"new-{index}")
        stream: OfferedStream | None = None
        try:
            async with asyncio.timeout(args.give_up):
                _, stream = await loop.create_connection(lambda: OfferedStream(request), "127.0.0.1", args.port)
                outcome, at = await asyncio.shield(stream.done)
        except asyncio.TimeoutError:
            outcome, at = "no answer", time.monotonic()
        except OSError as exc:
            outcome, at = type(exc).__name__, time.monotonic()
        finally:
            if stream is not None and stream.transport is not None:
                stream.transport.close()
        results.append((offered - started, outcome, at - offered))

    await asyncio.gather(*(offer_one(i) for i in range(count)))
    emit({"event": "offered", "rate": args.rate, "seconds": args.seconds, "n": count,
          "results": [(round(o, 4), outcome, round(w, 5)) for o, outcome, w in results]})


# ---- the orchestrator -----------------------------------------------------------------------


class Client:
    """A client-role subprocess spoken to line by line."""

    def __init__(self, procs: Processes, name: str, argv: list[str]) -> None:
        self.procs = procs
        self.child = procs.start(name, [PYTHON, "-m", "tests.bench.overload", *argv], env=python_env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(self, timeout: float) -> dict[str, Any]:
        stdout = self.child.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"{self.child.name} silent for {timeout} s")
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"{self.child.name} exited: {self.child.log_tail()}")
        return json.loads(line)

    def command(self, text: str, timeout: float = 60.0) -> dict[str, Any]:
        stdin = self.child.process.stdin
        assert stdin is not None
        stdin.write(text.encode() + b"\n")
        stdin.flush()
        return self.read(timeout)

    def stop(self) -> None:
        self.procs.stop(self.child)


def sustained_rate(procs: Processes, target: Target, seconds: float) -> float:
    """New streams/s the worker admits closed-loop (100 in flight, each closed at its first
    byte) while the open streams are held: the loadgen's `rate` mode."""
    out = subprocess.run(
        [PYTHON, "-m", "tests.bench.loadgen", "rate", "--port", str(target.port), "--token", target.token,
         "--concurrency", "100", "--seconds", str(seconds)],
        env=python_env(), capture_output=True, text=True, timeout=seconds + 60, check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["per_second"])


def summarise_offer(report: dict[str, Any]) -> dict[str, Any]:
    results = report["results"]
    served = [w for _, outcome, w in results if outcome == "served"]
    shed = [w for _, outcome, w in results if outcome == "shed"]
    shed_fast = [w for w in shed if w <= SHED_FAST_SECONDS]
    failed: dict[str, int] = {}
    failed_waits = []
    for _, outcome, waited in results:
        if outcome == "served" or (outcome == "shed" and waited <= SHED_FAST_SECONDS):
            continue
        key = "shed after 2 s" if outcome == "shed" else outcome
        failed[key] = failed.get(key, 0) + 1
        failed_waits.append(waited)
    waits = [w for _, _, w in results]
    return {
        "offered": len(results),
        "served": len(served),
        "shed_fast": len(shed_fast),
        "failed_slowly": sum(failed.values()),
        "failed_by_kind": failed,
        "ttfb_p50": percentile(served, 0.5),
        "ttfb_p99": percentile(served, 0.99),
        "shed_p50": percentile(shed, 0.5),
        "shed_p99": percentile(shed, 0.99),
        "waited_over_2s": sum(1 for w in waits if w > SHED_FAST_SECONDS),
        "longest_wait": max(waits) if waits else None,
        # For the picture: offset of each stream and how long it waited, by outcome.
        "samples": [(o, "failed" if outcome not in ("served", "shed") or (outcome == "shed" and w > 2) else outcome, w)
                    for o, outcome, w in results[:: max(1, len(results) // 4000)]],
    }


def run_mode(procs: Processes, args: argparse.Namespace, mode: str, env: dict[str, str], upstream_port: int,
             fxa_port: int, work_dir: Path, rate: float | None) -> dict[str, Any]:
    target = start_target(procs, "aiohttp-gunicorn", upstream_port=upstream_port, fxa_port=fxa_port,
                          work_dir=work_dir, service_env=env, label=f"gunicorn-{mode}")
    hold = Client(procs, f"timed-hold-{mode}", ["timed-hold", "--port", str(target.port), "--n", str(args.streams),
                                                "--token", target.token])
    try:
        opened = hold.read(120)
        measured_rate = None
        if rate is None:
            measured_rate = sustained_rate(procs, target, args.measure_seconds)
            rate = 2 * measured_rate
        time.sleep(2)
        t0 = hold.command("now")["t"]
        time.sleep(args.baseline)
        t1 = hold.command("now")["t"]
        quiet = hold.command(f"delays {t0} {t1} {args.interval}")
        counters_before = tcp_ext_counters()
        cpu_before = target.runtime_seconds()
        load_before = os.getloadavg()
        offering = Client(procs, f"offer-{mode}", ["offer", "--port", str(target.port), "--token", target.token,
                                                   "--rate", str(rate), "--seconds", str(args.seconds),
                                                   "--give-up", str(args.give_up)])
        t2 = hold.command("now")["t"]
        report = offering.read(args.seconds + args.give_up + 60)
        t3 = hold.command("now")["t"]
        cpu = target.runtime_seconds() - cpu_before
        counters_after = tcp_ext_counters()
        load_after = os.getloadavg()
        # The open streams' delay over the offer itself (not its tail of late answers).
        during = hold.command(f"delays {t2} {t2 + args.seconds} {args.interval}")
        offering.stop()
        return {
            "mode": mode, "env": env, "opened": opened, "sustained_rate": measured_rate, "rate": rate,
            "quiet": quiet, "during": during, "offer": summarise_offer(report),
            "listen_overflows": counters_after.get("ListenOverflows", 0) - counters_before.get("ListenOverflows", 0),
            "worker_cpu_percent": round(100 * cpu / max(t3 - t2, 1e-9), 1),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
        }
    finally:
        hold.stop()
        procs.stop(target.child)


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def print_mode(result: dict[str, Any]) -> None:
    offer_ = result["offer"]
    quiet, during = result["quiet"], result["during"]
    print(f"  {result['mode']:<10} rate {result['rate']:.0f}/s"
          + (f" (2 x sustained {result['sustained_rate']:.0f}/s)" if result["sustained_rate"] else "")
          + f"; open {result['opened']['open']}; load {result['load_before'][0]} -> {result['load_after'][0]}", flush=True)
    print(f"       open streams' delay over {ARGS_INTERVAL} s: quiet p50/p99/max {fmt_ms(quiet['p50'])}/"
          f"{fmt_ms(quiet['p99'])}/{fmt_ms(quiet['max'])} ms; during p50/p99/max {fmt_ms(during['p50'])}/"
          f"{fmt_ms(during['p99'])}/{fmt_ms(during['max'])} ms ({during['count']} events)")
    print(f"       new: offered {offer_['offered']}, served {offer_['served']}, shed fast {offer_['shed_fast']}, "
          f"failed slowly {offer_['failed_slowly']} {offer_['failed_by_kind']}; TTFB p50/p99 "
          f"{fmt_ms(offer_['ttfb_p50'])}/{fmt_ms(offer_['ttfb_p99'])} ms; 503 p50/p99 {fmt_ms(offer_['shed_p50'])}/"
          f"{fmt_ms(offer_['shed_p99'])} ms; waited > 2 s {offer_['waited_over_2s']}, longest "
          f"{offer_['longest_wait']:.2f} s")
    print(f"       listen overflows {result['listen_overflows']}; worker CPU {result['worker_cpu_percent']} %", flush=True)


ARGS_INTERVAL = 0.5


def verdicts(runs: list[dict[str, Any]], interval: float) -> list[tuple[str, bool]]:
    checks = []
    for index, run in enumerate(runs):
        off = run.get("off")
        for mode, result in run.items():
            if mode == "off":
                continue
            p99 = result["during"]["p99"]
            head = f"run {index + 1}, {mode}:"
            checks.append((f"{head} open streams' p99 delay {fmt_ms(p99)} ms <= 100 ms over the {interval} s interval",
                           p99 is not None and p99 <= 0.1))
            checks.append((f"{head} no new stream waited > 2 s ({result['offer']['waited_over_2s']} did)",
                           result["offer"]["waited_over_2s"] == 0))
            if off is not None:
                checks.append((f"{head} served {result['offer']['served']} >= without {off['offer']['served']}",
                               result["offer"]["served"] >= off["offer"]["served"]))
    return checks


def main_run(args: argparse.Namespace) -> int:
    global ARGS_INTERVAL
    ARGS_INTERVAL = args.interval
    terminate_on_sigterm()
    raise_open_file_limit()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-overload-"))
    on_env = {**PROTECTION_ON, **environment_assignments(args.on_env)}
    modes: dict[str, dict[str, str]] = {"off": {}, "on": on_env}
    for spec in args.mode:
        name, _, settings = spec.partition(":")
        modes[name] = {**PROTECTION_ON, **environment_assignments(item for item in settings.split(",") if item)}
    # Long enough for the open streams to outlive every mode's run.
    chunks = int((args.baseline + args.seconds + args.give_up + args.measure_seconds + 120) / args.interval)
    print(f"# overload benchmark {time.strftime('%Y-%m-%d %H:%M')} UTC; {args.streams} open streams, one event "
          f"every {args.interval} s; offer {args.seconds} s; load {os.getloadavg()}; logs {work_dir}", flush=True)
    runs: list[dict[str, Any]] = []
    try:
        with Processes(work_dir) as procs:
            upstream_port = start_paced_upstream(procs, ttft=0.2, chunks=chunks, interval=args.interval)
            fxa_port = start_fake_fxa(procs)
            rate = args.rate
            for index in range(args.runs):
                names = list(modes)
                order = names if index % 2 == 0 else names[::-1]
                run: dict[str, Any] = {}
                print(f"run {index + 1}", flush=True)
                for mode in order:
                    result = run_mode(procs, args, mode, modes[mode], upstream_port, fxa_port, work_dir, rate)
                    # Every mode of every run is offered the same rate (measured once, off).
                    rate = result["rate"]
                    print_mode(result)
                    run[mode] = result
                runs.append(run)
    except KeyboardInterrupt:
        print("interrupted: every started process has been stopped")
        return 130
    print("\n## verdicts (targets of issue 24 item 4)")
    for text, met in verdicts(runs, args.interval):
        print(f"  {'met' if met else 'MISSED':<6} {text}")
    if args.json:
        args.json.write_text(json.dumps({"overload": {"interval": args.interval, "runs": runs}}, indent=1))
    if args.plots:
        from .plots import write_plots

        for path in write_plots({"overload": {"interval": args.interval, "runs": runs}}, args.plots):
            print(f"  picture: {path}")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role")
    hold_parser = sub.add_parser("timed-hold")
    hold_parser.add_argument("--port", type=int, required=True)
    hold_parser.add_argument("--n", type=int, required=True)
    hold_parser.add_argument("--token", default="demo-token")
    offer_parser = sub.add_parser("offer")
    offer_parser.add_argument("--port", type=int, required=True)
    offer_parser.add_argument("--rate", type=float, required=True)
    offer_parser.add_argument("--seconds", type=float, required=True)
    offer_parser.add_argument("--give-up", type=float, default=15.0)
    offer_parser.add_argument("--token", default="demo-token")
    parser.add_argument("--streams", type=int, default=1000, help="open streams held throughout (1,000)")
    parser.add_argument("--interval", type=float, default=0.5, help="the upstream's seconds between events")
    parser.add_argument("--rate", type=float, help="new streams offered per second (default: 2 x sustained)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long new streams are offered (20)")
    parser.add_argument("--give-up", type=float, default=15.0, help="a new stream's client gives up after this")
    parser.add_argument("--baseline", type=float, default=5.0, help="quiet window before the offer")
    parser.add_argument("--measure-seconds", type=float, default=5.0, help="closed-loop window for the sustained rate")
    parser.add_argument("--runs", type=int, default=1, help="runs, each with both modes, order alternating")
    parser.add_argument("--on-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra settings of the protected mode (e.g. OVERLOAD_MAX_ADMISSIONS=64)")
    parser.add_argument("--mode", action="append", default=[], metavar="NAME:K=V,K=V",
                        help="a further protected mode (e.g. admissions:OVERLOAD_MAX_ADMISSIONS=32)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plots", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role is None:
        return main_run(args)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(timed_hold(args) if args.role == "timed-hold" else offer(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
