"""The performance suite: the service next to FastAPI peers and nginx, in one run.

    PYTHONPATH=. python -m tests.bench.open_streams --n 0,200,500,1000,2000,5000
    PYTHONPATH=. python -m tests.bench.open_streams --quick

Every server, upstream and load generator is its own process, in its own process group,
stopped at the end (also on Ctrl-C, SIGTERM or failure). The machine is shared and noisy, so
everything compared is measured in the same run, interleaved, and reported as ratios. The
open phase's CPU is over the whole --window, from the scheduler's per-thread nanosecond
count: utime+stime hold the same total in 10 ms ticks, and a relay near 1 % of a core gets
only ~15 of them in 15 s (they are printed too, with the --parts sub-windows, to show the
spread). Other phases report the median of the sub-windows of utime+stime.

Phases (--phases, default all):
  open     CPU of each target's process tree with N streams open (30 chunks at 1/s)
  idle     CPU with 2,000 streams whose upstream sent headers and then nothing
  chunk    CPU-µs per relayed SSE event, 200 streams × 50 events/s, service vs nginx
  close    client close → upstream connection closed, 200 streams closed one by one
  ttfb     added time to first body byte (service − direct), with 500 other streams open
  memory   RSS growth per open stream at 5,000 streams (silent, active, 16 KiB bodies)
  scale    10,000 concurrent streams on one worker (capped by RLIMIT_NOFILE): errors
  admission  a burst of 5,000 new streams offered in 3 s (listen-queue overflows from
           /proc/net/netstat, streams lost, time to first byte over the burst), then new
           streams admitted per second while 2,000 others are open; service under `serve`
           and gunicorn next to nginx, --admission-runs rounds with the order rotated
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .procs import Child, Processes, raise_open_file_limit, terminate_on_sigterm
from .targets import (
    ALL_TARGETS,
    OPTIONAL_TARGETS,
    PRODUCTION_TARGETS,
    PYTHON,
    UPSTREAM_KEY,
    Target,
    python_env,
    start_fake_fxa,
    start_fake_litellm,
    start_paced_upstream,
    start_target,
)

if TYPE_CHECKING:
    from .production import ProductionConfiguration

PHASES = ("open", "idle", "chunk", "close", "ttfb", "memory", "scale", "admission")


# ---- talking to a load generator ---------------------------------------------------------


class Loadgen:
    """A `tests.bench.loadgen hold` process, driven line by line over its stdin/stdout."""

    def __init__(
        self,
        procs: Processes,
        target: Target,
        n: int,
        *,
        content: str = "hi",
        open_on: str = "body",
        concurrency: int = 200,
        open_timeout: float = 90.0,
        wait: bool = True,
    ) -> None:
        self.procs = procs
        self.open_timeout = open_timeout
        self.child: Child = procs.start(
            f"loadgen-{target.name}-{n}",
            [PYTHON, "-m", "tests.bench.loadgen", "hold", "--port", str(target.port), "--n", str(n),
             "--token", target.token, "--content", content, "--open-on", open_on,
             "--concurrency", str(concurrency), "--open-timeout", str(open_timeout)],
            env=python_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.opened: dict[str, Any] = self._read(open_timeout + 30) if wait else {}

    def wait_opened(self) -> dict[str, Any]:
        """For a load generator started with wait=False: its "opened" report."""
        if not self.opened:
            self.opened = self._read(self.open_timeout + 30)
        return self.opened

    def _read(self, timeout: float) -> dict[str, Any]:
        stdout = self.child.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"load generator silent for {timeout} s")
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited: {self.child.log_tail()}")
        return json.loads(line)

    def command(self, text: str, timeout: float = 30.0) -> dict[str, Any]:
        stdin = self.child.process.stdin
        assert stdin is not None
        stdin.write(text.encode() + b"\n")
        stdin.flush()
        return self._read(timeout)

    def close(self) -> None:
        try:
            self.command("exit", timeout=10)
        except (OSError, TimeoutError, RuntimeError, ValueError):
            pass
        self.procs.stop(self.child)


# ---- measuring --------------------------------------------------------------------------


def host_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / 100.0  # USER_HZ is 100 on Linux


@dataclass
class Window:
    """CPU of one process tree (and events received by the client) over sub-windows."""

    cpu_percent: list[float] = field(default_factory=list)  # % of one core, per sub-window
    cpu_seconds: list[float] = field(default_factory=list)
    runtime_seconds: list[float] = field(default_factory=list)  # the same, in ns resolution
    events: list[int] = field(default_factory=list)
    host_percent: float = 0.0
    seconds: float = 0.0
    open_at_end: int | None = None

    @property
    def median_percent(self) -> float:
        return statistics.median(self.cpu_percent)

    @property
    def mean_percent(self) -> float:
        return 100.0 * sum(self.cpu_seconds) / self.seconds

    @property
    def runtime_percent(self) -> float:
        return 100.0 * sum(self.runtime_seconds) / self.seconds

    @property
    def us_per_event(self) -> list[float]:
        return [1e6 * cpu / events for cpu, events in zip(self.cpu_seconds, self.events) if events]


def measure_window(
    cpu: Callable[[], float],
    window: float,
    parts: int,
    loadgen: Loadgen | None = None,
    runtime: Callable[[], float] | None = None,
) -> Window:
    result = Window()
    events_before = loadgen.command("stats")["events"] if loadgen else 0
    started = time.monotonic()
    host_before = host_busy_seconds()
    cpu_before, at = cpu(), started
    runtime_before = runtime() if runtime else 0.0
    for index in range(parts):
        time.sleep(max(0.0, started + window * (index + 1) / parts - time.monotonic()))
        cpu_now, now = cpu(), time.monotonic()
        if runtime:
            runtime_now = runtime()
            result.runtime_seconds.append(runtime_now - runtime_before)
            runtime_before = runtime_now
        if loadgen:
            stats = loadgen.command("stats")
            result.events.append(stats["events"] - events_before)
            events_before = stats["events"]
            result.open_at_end = stats["open"]
        result.cpu_seconds.append(cpu_now - cpu_before)
        result.cpu_percent.append(100.0 * (cpu_now - cpu_before) / (now - at))
        cpu_before, at = cpu_now, now
    result.seconds = time.monotonic() - started
    result.host_percent = 100.0 * (host_busy_seconds() - host_before) / result.seconds
    return result


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[rank]


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.3f}" if theirs > 0.05 else "-"


def say(text: str = "") -> None:
    print(text, flush=True)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.rjust(width) for cell, width in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


# ---- phases -----------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    work_dir: Path
    procs: Processes
    fxa_port: int
    results: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, Path] = field(default_factory=dict)
    production: ProductionConfiguration | None = None  # started when a production target is chosen

    def targets(self, procs: Processes, names: Sequence[str], upstream_port: int) -> list[Target]:
        return [start_target(procs, name, upstream_port=upstream_port, fxa_port=self.fxa_port, work_dir=self.work_dir,
                             baselines=self.baselines, production=self.production)
                for name in names]

    def settle(self, seconds: float = 1.0) -> None:
        time.sleep(seconds)


def phase_open(run: Run) -> None:
    args = run.args
    say(f"\n## open streams: CPU % of one core over {args.window:.0f} s (sub-windows of {args.window / args.parts:.0f} s), "
        f"upstream 200 ms TTFT then 30 chunks at 1/s")
    rows: dict[int, dict[str, Window]] = {}
    with Processes(run.work_dir) as procs:
        upstream = start_fake_litellm(procs, ttft=0.2, chunks=30, interval=1.0)
        targets = run.targets(procs, args.targets, upstream)
        for n in args.n:
            rows[n] = {}
            for target in targets:
                loadgen = Loadgen(procs, target, n, open_timeout=args.open_timeout) if n else None
                try:
                    if loadgen and loadgen.opened["open"] < n:
                        say(f"  {target.name} N={n}: only {loadgen.opened['open']} opened "
                            f"({loadgen.opened['errors']} errors: {loadgen.opened['error_samples'][:2]})")
                    run.settle()
                    window = measure_window(target.cpu_seconds, args.window, args.parts, loadgen,
                                            runtime=target.runtime_seconds)
                finally:
                    if loadgen:
                        loadgen.close()
                rows[n][target.name] = window
                opened = loadgen.opened if loadgen else {"seconds": 0.0}
                say(f"  N={n:>5} {target.name:<17} cpu {window.runtime_percent:6.2f} % "
                    f"(utime+stime {window.mean_percent:.2f} %, sub-windows {', '.join(f'{p:.1f}' for p in window.cpu_percent)}; "
                    f"host {window.host_percent:.0f} %; "
                    f"open at end {window.open_at_end if window.open_at_end is not None else 0}/{n}; "
                    f"opened in {opened['seconds']:.1f} s)")
                time.sleep(1.0)  # let the closed streams' teardown finish outside the next window
    names = [target for target in args.targets]
    say(f"\nCPU, % of one core over {args.window:.0f} s:")
    say(table(["N", *names], [[n, *(f"{rows[n][name].runtime_percent:.2f}" for name in names)] for n in args.n]))
    ours = [name for name in names if name.startswith("aiohttp")]
    theirs = [name for name in names if not name.startswith("aiohttp")]
    if ours and theirs:
        header = ["N", *(f"{o} / {t}" for o in ours for t in theirs)]
        say("\nRatios (ours / peer):")
        say(table(header, [[n, *(ratio(rows[n][o].runtime_percent, rows[n][t].runtime_percent) for o in ours for t in theirs)]
                           for n in args.n]))
    run.results["open"] = {
        str(n): {name: {"percent": w.runtime_percent, "ticks_percent": w.mean_percent, "sub_windows": w.cpu_percent, "host_percent": w.host_percent,
                        "open_at_end": w.open_at_end} for name, w in rows[n].items()}
        for n in args.n
    }


def phase_idle(run: Run) -> None:
    args = run.args
    n = args.idle_n
    say(f"\n## idle silent streams: {n} streams, upstream sends headers then nothing; CPU over {args.window:.0f} s")
    results = {}
    with Processes(run.work_dir) as procs:
        upstream = start_fake_litellm(procs, ttft=0.2, chunks=30, interval=1.0)
        for target in run.targets(procs, [name for name in args.targets if name.startswith("aiohttp")], upstream):
            loadgen = Loadgen(procs, target, n, content="[fake:hang_after_headers] idle", open_on="headers",
                              open_timeout=args.open_timeout)
            try:
                run.settle(2.0)  # the service answers headers before it reaches the upstream
                window = measure_window(target.cpu_seconds, args.window, args.parts, loadgen)
            finally:
                loadgen.close()
            results[target.name] = {"mean_percent": window.mean_percent, "cpu_ms": 1000 * sum(window.cpu_seconds),
                                    "open_at_end": window.open_at_end}
            say(f"  {target.name:<17} {window.mean_percent:.3f} % of one core ({1000 * sum(window.cpu_seconds):.0f} ms "
                f"CPU in {window.seconds:.1f} s; {window.open_at_end}/{n} open; events {sum(window.events)})")
    run.results["idle"] = results


def phase_chunk(run: Run) -> None:
    """CPU-µs per relayed event at each --chunk-rates (events/s per stream, 200 streams)."""
    args = run.args
    n = 200
    names = [name for name in args.targets if name.startswith("aiohttp") or name == "nginx"]
    by_rate: dict[str, dict[str, Any]] = {}
    for rate in args.chunk_rates:
        say(f"\n## per-chunk cost: {n} streams × {rate:g} events/s, CPU-µs per relayed event (median of sub-windows)")
        results = {}
        with Processes(run.work_dir) as procs:
            chunks = int(rate * (args.window + 20))  # the streams outlast ramp, settle and window
            upstream = start_paced_upstream(procs, ttft=0.2, chunks=chunks, interval=1.0 / rate)
            for target in run.targets(procs, names, upstream):
                loadgen = Loadgen(procs, target, n, open_timeout=args.open_timeout)
                try:
                    run.settle()
                    window = measure_window(target.cpu_seconds, args.window, args.parts, loadgen)
                finally:
                    loadgen.close()
                per_event = statistics.median(window.us_per_event)
                results[target.name] = {"us_per_event": per_event, "events_per_s": sum(window.events) / window.seconds,
                                        "cpu_percent": window.median_percent, "host_percent": window.host_percent}
                say(f"  {target.name:<17} {per_event:6.1f} µs/event ({sum(window.events) / window.seconds:.0f} events/s, "
                    f"cpu {window.median_percent:.1f} %, host {window.host_percent:.0f} %, load {os.getloadavg()[0]:.1f})")
                time.sleep(1.0)
        if "nginx" in results:
            for name in results:
                if name != "nginx":
                    say(f"  {name} / nginx: {results[name]['us_per_event'] / results['nginx']['us_per_event']:.2f}")
        by_rate[str(int(rate * n))] = results
    run.results["chunk_rates"] = by_rate
    # The highest rate is what the per-chunk verdict has always compared.
    run.results["chunk"] = by_rate[str(int(max(args.chunk_rates) * n))]


def phase_close(run: Run) -> None:
    args = run.args
    n, gap = 200, 0.02
    say(f"\n## disconnect latency: {n} streams mid-generation, closed one by one {gap * 1000:.0f} ms apart; "
        "client close → upstream sees its connection closed")
    lost_log = run.work_dir / "upstream-lost.log"
    lost_log.touch()
    results = {}
    with Processes(run.work_dir) as procs:
        upstream = start_paced_upstream(procs, ttft=0.2, chunks=60, interval=1.0, lost_log=lost_log)
        for target in run.targets(procs, args.targets, upstream):
            offset = lost_log.stat().st_size
            loadgen = Loadgen(procs, target, n, content="bench-stream-{i}", open_timeout=args.open_timeout)
            try:
                run.settle(1.5)  # mid-generation: a couple of chunks relayed
                closes = dict(loadgen.command(f"close_one_by_one {gap}", timeout=60)["closes"])
                deadline = time.monotonic() + 3.0  # a poller needs up to its interval
                while time.monotonic() < deadline:
                    time.sleep(0.2)
                    with lost_log.open() as log:
                        log.seek(offset)
                        seen = {int(i): float(t) for i, t in (line.split() for line in log if line.strip())}
                    if all(index in seen for index in closes):
                        break
            finally:
                loadgen.close()
            latencies = [1000 * (seen[index] - closed) for index, closed in closes.items() if index in seen]
            missing = sum(1 for index in closes if index not in seen)
            results[target.name] = {"p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99),
                                    "max_ms": max(latencies, default=float("nan")), "missing": missing}
            say(f"  {target.name:<17} p50 {percentile(latencies, 0.5):7.2f} ms  p99 {percentile(latencies, 0.99):7.2f} ms  "
                f"max {max(latencies, default=float('nan')):7.2f} ms  ({len(latencies)} matched, {missing} unseen)")
    run.results["close"] = results


def phase_ttfb(run: Run) -> None:
    args = run.args
    n, count = args.ttfb_background, args.ttfb_count
    say(f"\n## added time to first body byte: service − direct to the upstream, {count} sequential probes each, "
        f"{n} other streams open through the service")
    results = {}
    with Processes(run.work_dir) as procs:
        # No upstream delay: what is left is the relay's own latency (plus connects).
        upstream = start_fake_litellm(procs, ttft=0.0, chunks=30, interval=1.0)
        for target in run.targets(procs, [name for name in args.targets if name.startswith("aiohttp")], upstream):
            loadgen = Loadgen(procs, target, n, open_timeout=args.open_timeout)
            try:
                run.settle()
                prober = procs.start(
                    f"probe-{target.name}",
                    [PYTHON, "-m", "tests.bench.loadgen", "probe", "--count", str(count),
                     "--target", f"direct,{upstream},{UPSTREAM_KEY}", "--target", f"service,{target.port},{target.token}"],
                    env=python_env(),
                    stdout=subprocess.PIPE,
                )
                stdout, _ = prober.process.communicate(timeout=120)
                probed = json.loads(stdout.decode().strip().splitlines()[-1])
                still_open = loadgen.command("stats")["open"]
            finally:
                loadgen.close()
            direct, service = probed["samples"]["direct"], probed["samples"]["service"]
            figures = {
                "direct_p50_ms": 1000 * percentile(direct, 0.5), "direct_p99_ms": 1000 * percentile(direct, 0.99),
                "service_p50_ms": 1000 * percentile(service, 0.5), "service_p99_ms": 1000 * percentile(service, 0.99),
                "failures": probed["failures"], "background_open": still_open,
            }
            figures["added_p50_ms"] = figures["service_p50_ms"] - figures["direct_p50_ms"]
            figures["added_p99_ms"] = figures["service_p99_ms"] - figures["direct_p99_ms"]
            results[target.name] = figures
            say(f"  {target.name:<17} added p50 {figures['added_p50_ms']:.2f} ms, p99 {figures['added_p99_ms']:.2f} ms "
                f"(direct {figures['direct_p50_ms']:.2f}/{figures['direct_p99_ms']:.2f}, through service "
                f"{figures['service_p50_ms']:.2f}/{figures['service_p99_ms']:.2f} ms p50/p99; "
                f"{still_open}/{n} background open; failures {probed['failures']})")
    run.results["ttfb"] = results


def phase_memory(run: Run) -> None:
    """RSS growth per open stream, twice: streams relaying 1 chunk/s (state plus whatever
    is in flight at that throughput) and silent streams (the per-stream state alone)."""
    args = run.args
    say(f"\n## memory: RSS growth per open stream at {', '.join(str(n) for n in args.memory_n)} streams")
    results = {}
    kinds = (
        ("silent", "[fake:hang_after_headers] idle", "headers"),  # headers, then nothing
        ("active", "hi", "body"),  # 60 chunks at 1/s: every stream is relaying
        # Silent again, each request carrying a 16 KiB conversation: what a stream keeps of it.
        ("silent+16KiB", "[fake:hang_after_headers] " + "lorem ipsum dolor sit amet " * 607, "headers"),
    )
    # A fresh process per kind: memory freed by a finished wave stays with the process,
    # so a second wave in the same process would mostly reuse the first one's.
    names = [name for name in args.targets if name.startswith("aiohttp") or name == "nginx"]
    chosen = [kind for kind in kinds if kind[0] in args.memory_kinds]
    for n, (kind, content, open_on) in ((n, kind) for n in args.memory_n for kind in chosen):
        with Processes(run.work_dir) as procs:
            upstream = start_fake_litellm(procs, ttft=0.2, chunks=60, interval=1.0)
            for target in run.targets(procs, names, upstream):
                # Warm the allocator and lazily built state with a smaller wave first
                # (--memory-warmup 0: a fresh process, what the first streams cost).
                if args.memory_warmup > 0:
                    warm = Loadgen(procs, target, min(args.memory_warmup, n), content=content, open_on=open_on,
                                   open_timeout=args.open_timeout)
                    warm.close()
                    time.sleep(2.0)
                before = target.rss_bytes()
                loadgen = Loadgen(procs, target, n, content=content, open_on=open_on, open_timeout=args.open_timeout)
                try:
                    run.settle(2.0)
                    after = target.rss_bytes()
                    open_now = loadgen.command("stats")["open"]
                finally:
                    loadgen.close()
                time.sleep(2.0)
                per_stream = (after - before) / max(open_now, 1)
                results[f"{target.name}/{kind}@{n}"] = {"kib_per_stream": per_stream / 1024, "rss_before_mib": before / 2**20,
                                                         "rss_after_mib": after / 2**20, "open": open_now, "streams": n}
                say(f"  N={n:>5} {target.name:<17} {kind:<12} {per_stream / 1024:.1f} KiB per stream (RSS {before / 2**20:.1f} → "
                    f"{after / 2**20:.1f} MiB with {open_now} open)")
    run.results["memory"] = results


def phase_scale(run: Run, open_files: int) -> None:
    args = run.args
    # Each stream holds two sockets in the service (client and upstream).
    n = min(args.scale_n, (open_files - 200) // 2)
    say(f"\n## scale: {n} concurrent streams on one aiohttp worker (gunicorn), counted to completion")
    if n < args.scale_n:
        say(f"  note: RLIMIT_NOFILE is {open_files} here (hard limit), so {args.scale_n} streams (2 sockets each "
            f"in the service) cannot be held; running {n}")
    with Processes(run.work_dir) as procs:
        upstream = start_fake_litellm(procs, ttft=0.2, chunks=40, interval=1.0)
        target = run.targets(procs, ["aiohttp-gunicorn"], upstream)[0]
        loadgen = Loadgen(procs, target, n, concurrency=500, open_timeout=args.open_timeout)
        try:
            done = loadgen.command("wait_done 120", timeout=150)
        finally:
            loadgen.close()
    result = {"streams": n, "completed": done["completed"], "errors": done["errors"], "peak_open": done["peak_open"],
              "unfinished": done["unfinished"], "open_seconds": loadgen.opened["seconds"],
              "error_samples": done["error_samples"]}
    run.results["scale"] = result
    say(f"  {done['completed']}/{n} completed, {done['errors']} errors, {done['unfinished']} unfinished, peak "
        f"{done['peak_open']} open at once (all opened in {loadgen.opened['seconds']:.1f} s) {done['error_samples'][:2]}")


def tcp_ext_counters() -> dict[str, int]:
    """The TcpExt counters of this network namespace (what `nstat` shows)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for header, values in zip(lines[::2], lines[1::2]):
        if header.startswith("TcpExt:"):
            return dict(zip(header.split()[1:], (int(v) for v in values.split()[1:])))
    return {}


ADMISSION_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies")


def phase_admission(run: Run) -> None:
    args = run.args
    n, seconds, held = args.burst_n, args.burst_seconds, args.admission_held
    names = [name for name in args.targets
             if name.partition("@")[0] in ("aiohttp-serve", "aiohttp-gunicorn", "aiohttp-bare", "nginx")]
    say(f"\n## admission: {n} new streams offered in {seconds:.0f} s (no gate), then new streams/s with {held} open; "
        f"{args.admission_runs} rounds, order rotated; upstream: first event at once, then 1/s")
    bursts: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    rates: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with Processes(run.work_dir) as procs:
        upstream = start_paced_upstream(procs, ttft=0.0, chunks=90, interval=1.0)
        targets = run.targets(procs, names, upstream)
        for round_index in range(args.admission_runs):
            shift = round_index % len(targets)
            for target in targets[shift:] + targets[:shift]:
                # 1. The burst.
                before = tcp_ext_counters()
                cpu_before, delay_before = target.runtime_seconds(), target.run_delay_seconds()
                child = procs.start(
                    f"burst-{target.name}-{round_index}",
                    [PYTHON, "-m", "tests.bench.loadgen", "burst", "--port", str(target.port), "--n", str(n),
                     "--seconds", str(seconds), "--token", target.token, "--content", "burst-{i}"],
                    env=python_env(), stdout=subprocess.PIPE,
                )
                stdout, _ = child.process.communicate(timeout=seconds + 120)
                after = tcp_ext_counters()
                burst_cpu = target.runtime_seconds() - cpu_before
                burst_delay = target.run_delay_seconds() - delay_before
                procs.stop(child)
                burst = json.loads(stdout.decode().strip().splitlines()[-1])
                deltas = {name: after.get(name, 0) - before.get(name, 0) for name in ADMISSION_COUNTERS}
                answered = [(o, t) for o, t in zip(burst["offsets"], burst["ttfb"]) if t is not None]
                ttfbs = [t for _, t in answered]
                figures = {
                    "round": round_index, **deltas, "lost": n - len(answered), "failures": burst["failures"],
                    "ttfb_p50_ms": 1000 * percentile(ttfbs, 0.5), "ttfb_p99_ms": 1000 * percentile(ttfbs, 0.99),
                    "ttfb_max_ms": 1000 * max(ttfbs, default=float("nan")),
                    "last_first_byte_s": max((o + t for o, t in answered), default=float("nan")),
                    "offsets": burst["offsets"], "ttfb": burst["ttfb"],
                    "cpu_us_per_stream": 1e6 * burst_cpu / max(1, len(answered)), "run_delay_s": burst_delay,
                }
                bursts[target.name].append(figures)
                say(f"  round {round_index} {target.name:<17} burst: overflows {deltas['ListenOverflows']}, drops "
                    f"{deltas['ListenDrops']}, lost {figures['lost']} {burst['failures'] or ''}; TTFB p50 "
                    f"{figures['ttfb_p50_ms']:.1f} ms, p99 {figures['ttfb_p99_ms']:.0f} ms, max {figures['ttfb_max_ms']:.0f} ms; "
                    f"last first byte at {figures['last_first_byte_s']:.2f} s; {figures['cpu_us_per_stream']:.0f} µs CPU per "
                    f"stream, {burst_delay:.1f} s waiting for a CPU (host load {os.getloadavg()[0]:.1f})")
                time.sleep(3.0)  # the burst's streams are closed: let their teardown finish
                # 2. New streams per second with `held` others open.
                loadgen = Loadgen(procs, target, held, open_timeout=args.open_timeout)
                try:
                    run.settle()
                    quiet_before = target.runtime_seconds()
                    time.sleep(2.0)
                    background = (target.runtime_seconds() - quiet_before) / 2.0  # the open streams' own relaying
                    cpu_before, delay_before = target.runtime_seconds(), target.run_delay_seconds()
                    prober = procs.start(
                        f"rate-{target.name}-{round_index}",
                        [PYTHON, "-m", "tests.bench.loadgen", "rate", "--port", str(target.port),
                         "--concurrency", str(args.admission_concurrency), "--seconds", str(args.admission_seconds),
                         "--token", target.token, "--content", "rate-{i}"],
                        env=python_env(), stdout=subprocess.PIPE,
                    )
                    stdout, _ = prober.process.communicate(timeout=args.admission_seconds + 60)
                    rate_cpu = target.runtime_seconds() - cpu_before
                    rate_delay = target.run_delay_seconds() - delay_before
                    procs.stop(prober)
                    still_open = loadgen.command("stats")["open"]
                finally:
                    loadgen.close()
                rate = json.loads(stdout.decode().strip().splitlines()[-1])
                window = rate["seconds"]
                figures = {"round": round_index, "per_second": rate["per_second"], "held_open": still_open,
                           "cpu_percent": 100 * rate_cpu / window, "background_percent": 100 * background,
                           "cpu_us_per_stream": 1e6 * (rate_cpu - background * window) / max(1, rate["admitted"]),
                           "run_delay_percent": 100 * rate_delay / window,
                           "ttfb_p50_ms": 1000 * percentile(rate["ttfb"], 0.5),
                           "ttfb_p99_ms": 1000 * percentile(rate["ttfb"], 0.99), "failures": rate["failures"]}
                rates[target.name].append(figures)
                say(f"  round {round_index} {target.name:<17} new streams/s with {still_open}/{held} open: "
                    f"{rate['per_second']:.0f} (TTFB p50 {figures['ttfb_p50_ms']:.1f} ms, p99 {figures['ttfb_p99_ms']:.1f} ms; "
                    f"CPU {figures['cpu_percent']:.0f} % of a core, {figures['background_percent']:.1f} % before; "
                    f"{figures['cpu_us_per_stream']:.0f} µs CPU per new stream; runnable but waiting "
                    f"{figures['run_delay_percent']:.0f} % of the window; "
                    f"failures {rate['failures'] or 0}; host load {os.getloadavg()[0]:.1f})")
                time.sleep(2.0)
    say("\nAdmission, medians over rounds:")
    rows = []
    for name in names:
        b, r = bursts[name], rates[name]
        rows.append([name, statistics.median(x["ListenOverflows"] for x in b), statistics.median(x["lost"] for x in b),
                     f"{statistics.median(x['ttfb_p50_ms'] for x in b):.1f}", f"{statistics.median(x['ttfb_p99_ms'] for x in b):.0f}",
                     f"{statistics.median(x['last_first_byte_s'] for x in b):.2f}",
                     f"{statistics.median(x['per_second'] for x in r):.0f}",
                     f"{statistics.median(x['cpu_us_per_stream'] for x in r):.0f}"])
    say(table(["target", "overflows", "lost", "burst TTFB p50 ms", "p99 ms", "last first byte s", f"new/s, {held} open",
               "µs CPU per new stream"], rows))
    if "nginx" in rates:
        for name in names:
            if name != "nginx":
                ratios = [ours["per_second"] / theirs["per_second"] for ours, theirs in zip(rates[name], rates["nginx"])
                          if theirs["per_second"]]
                say(f"  {name} / nginx new streams/s, per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
                    f"median {statistics.median(ratios):.2f}")
                cpu = [ours["cpu_us_per_stream"] / theirs["cpu_us_per_stream"] for ours, theirs in zip(rates[name], rates["nginx"])
                       if theirs["cpu_us_per_stream"] > 0]
                if cpu:
                    say(f"  {name} / nginx CPU per new stream, per round: {', '.join(f'{x:.1f}' for x in cpu)}; "
                        f"median {statistics.median(cpu):.1f}×")
    run.results["admission"] = {"burst": bursts, "rate": rates, "n": n, "seconds": seconds, "held": held}


# ---- verdicts ---------------------------------------------------------------------------


def verdicts(results: dict[str, Any], service: str) -> list[tuple[str, str, bool | None]]:
    checks: list[tuple[str, str, bool | None]] = []

    def get(*path: str) -> Any:
        node: Any = results
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    ours = get("open", "500", service, "percent")
    receive = get("open", "500", "fastapi-receive", "percent")
    nginx = get("open", "500", "nginx", "percent")
    if ours is not None and receive:
        checks.append(("N=500 CPU ≤ 1/8 of the receive() peer", f"{ours / receive:.3f}", ours / receive <= 1 / 8))
    bare = get("open", "500", "fastapi-receive-bare", "percent")
    if ours is not None and bare:
        checks.append(("N=500 CPU ≤ 1/8 of the bare receive() relay (no middlewares, no inspection)",
                       f"{ours / bare:.3f}", ours / bare <= 1 / 8))
    if ours is not None and nginx:
        checks.append(("N=500 CPU ≤ 1.5× nginx", f"{ours / nginx:.2f}×", ours / nginx <= 1.5))
    idle = get("idle", service, "mean_percent")
    if idle is not None:
        checks.append(("2,000 idle streams ≤ 0.5 % of a core", f"{idle:.3f} %", idle <= 0.5))
    for rate, figures in sorted(results.get("chunk_rates", {}).items(), key=lambda item: int(item[0])):
        ours_event, nginx_event = figures.get(service, {}).get("us_per_event"), figures.get("nginx", {}).get("us_per_event")
        if ours_event is not None and nginx_event:
            checks.append((f"per event ≤ 1.5× nginx at {int(rate):,} events/s",
                           f"{ours_event / nginx_event:.2f}× ({ours_event:.1f} vs {nginx_event:.1f} µs)", ours_event / nginx_event <= 1.5))
    close = get("close", service, "p99_ms")
    if close is not None:
        checks.append(("close → upstream closed p99 ≤ 5 ms", f"{close:.2f} ms", close <= 5))
    added50, added99 = get("ttfb", service, "added_p50_ms"), get("ttfb", service, "added_p99_ms")
    if added50 is not None:
        checks.append(("added TTFB p50 ≤ 1 ms", f"{added50:.2f} ms", added50 <= 1))
        checks.append(("added TTFB p99 ≤ 5 ms", f"{added99:.2f} ms", added99 <= 5))
    floor50 = get("ttfb", "aiohttp-bare", "added_p50_ms")
    if floor50 is not None:
        checks.append(("  floor: bare aiohttp relay, added TTFB p50", f"{floor50:.2f} ms", None))
    for key in sorted(results.get("memory", {})):
        name, _, kind_at = key.partition("/")
        if name != service:
            continue
        memory = results["memory"][key]["kib_per_stream"]
        nginx_memory = get("memory", f"nginx/{kind_at}", "kib_per_stream")
        checks.append((f"RSS ≤ 20 KiB per stream ({kind_at})", f"{memory:.1f} KiB", memory <= 20))
        if nginx_memory:
            checks.append((f"RSS per stream ≤ 1.5× nginx ({kind_at})", f"{memory / nginx_memory:.2f}× ({nginx_memory:.1f} KiB)",
                           memory / nginx_memory <= 1.5))
        floor = get("memory", f"aiohttp-bare/{kind_at}", "kib_per_stream")
        if floor is not None:
            checks.append((f"  floor: bare aiohttp relay, RSS per stream ({kind_at})", f"{floor:.1f} KiB", None))
    admission = get("admission")
    if admission is not None:
        rates, bursts = admission["rate"], admission["burst"]
        for name in ("aiohttp-serve", "aiohttp-gunicorn"):
            if name in rates and "nginx" in rates:
                ratios = [o["per_second"] / t["per_second"] for o, t in zip(rates[name], rates["nginx"]) if t["per_second"]]
                if ratios:
                    checks.append((f"{name}: new streams/s with {admission['held']} open ≥ 0.8× nginx (median of rounds)",
                                   f"{statistics.median(ratios):.2f}×", statistics.median(ratios) >= 0.8))
            if name in bursts:
                overflows = max(x["ListenOverflows"] for x in bursts[name])
                lost = max(x["lost"] for x in bursts[name])
                checks.append((f"{name}: {admission['n']} streams in {admission['seconds']:.0f} s, 0 overflows and none lost "
                               "(worst round)", f"{overflows} overflows, {lost} lost", overflows == 0 and lost == 0))
    scale = get("scale")
    if scale is not None:
        ok = scale["errors"] == 0 and scale["completed"] == scale["streams"]
        checks.append((f"{scale['streams']} concurrent streams, zero errors",
                       f"{scale['completed']} ok, {scale['errors']} errors, peak {scale['peak_open']}",
                       ok if scale["streams"] >= 10000 else (None if ok else False)))
    return checks


def export_tree(ref: str, work_dir: Path) -> Path:
    """The repository's files at `ref`, exported (git archive) under the run's directory."""
    from .targets import REPO_ROOT

    destination = work_dir / f"tree-{ref.replace('/', '_')}"
    destination.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(destination)], input=archive, check=True)
    return destination


# ---- command line -----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.open_streams", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", default="0,200,500,1000,2000,5000", help="open-stream counts for the open phase")
    parser.add_argument("--targets", default=",".join(ALL_TARGETS), help=f"subset of {','.join(ALL_TARGETS + OPTIONAL_TARGETS)}")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"subset of {','.join(PHASES)}")
    parser.add_argument("--window", type=float, default=15.0, help="CPU measurement window, seconds")
    parser.add_argument("--parts", type=int, default=3, help="sub-windows whose median is reported")
    parser.add_argument("--open-timeout", type=float, default=45.0, help="longest wait for N streams to open")
    parser.add_argument("--idle-n", type=int, default=2000)
    parser.add_argument("--memory-n", default="2000,5000", help="stream counts of the memory phase")
    parser.add_argument("--memory-warmup", type=int, default=500, help="memory: streams of the warm-up wave (0: fresh process)")
    parser.add_argument("--memory-kinds", default="silent,active,silent+16KiB", help="which kinds of stream to measure")
    parser.add_argument("--chunk-rates", default="10,50", help="events/s per stream of the chunk phase (200 streams)")
    parser.add_argument("--scale-n", type=int, default=10000)
    parser.add_argument("--ttfb-background", type=int, default=500)
    parser.add_argument("--ttfb-count", type=int, default=300)
    parser.add_argument("--burst-n", type=int, default=5000, help="admission: streams offered in the burst")
    parser.add_argument("--burst-seconds", type=float, default=3.0, help="admission: the burst's length")
    parser.add_argument("--admission-held", type=int, default=2000, help="admission: streams open while the rate is measured")
    parser.add_argument("--admission-concurrency", type=int, default=100, help="admission: new streams in flight")
    parser.add_argument("--admission-seconds", type=float, default=5.0, help="admission: rate window")
    parser.add_argument("--admission-runs", type=int, default=3, help="admission: rounds (medians reported)")
    parser.add_argument("--baseline-ref", help="git refs, comma-separated: also run every service target of the chosen "
                        "ones from each commit's tree, as NAME@REF, for before/after in one run")
    parser.add_argument("--quick", action="store_true",
                        help="a few minutes: N=0,500, 6 s windows, smaller idle/memory/scale counts")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--plots", type=Path, help="write PNG pictures of the figures into this directory")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temporary directory with process logs")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.window, args.idle_n, args.memory_n, args.scale_n, args.ttfb_count = "0,500", 6.0, 2000, "2000", 3000, 150
    args.n = [int(value) for value in str(args.n).split(",") if value.strip()]
    args.memory_n = [int(value) for value in str(args.memory_n).split(",") if value.strip()]
    args.memory_kinds = [value.strip() for value in str(args.memory_kinds).split(",") if value.strip()]
    args.chunk_rates = [float(value) for value in str(args.chunk_rates).split(",") if value.strip()]
    args.targets = [name.strip() for name in args.targets.split(",") if name.strip()]
    args.phases = [name.strip() for name in args.phases.split(",") if name.strip()]
    args.baseline_refs = [ref.strip() for ref in (args.baseline_ref or "").split(",") if ref.strip()]
    args.targets += [
        f"{name}@{ref}" for ref in args.baseline_refs for name in args.targets if name in ("aiohttp-serve", "aiohttp-gunicorn")
    ]
    for name in args.targets:
        if name.partition("@")[0] not in ALL_TARGETS + OPTIONAL_TARGETS:
            parser.error(f"unknown target {name!r}")
    for name in args.phases:
        if name not in PHASES:
            parser.error(f"unknown phase {name!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    terminate_on_sigterm()
    open_files = raise_open_file_limit()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-bench-"))
    started = time.monotonic()
    say(f"# mlpa-aiohttp benchmarks ({time.strftime('%Y-%m-%d %H:%M')}, RLIMIT_NOFILE {open_files}, logs {work_dir})")
    service = next((name for name in args.targets if name.startswith("aiohttp")), "aiohttp-gunicorn")
    run: Run | None = None
    completed = False
    try:
        with contextlib.ExitStack() as stack:
            production = None
            if any(name.partition("@")[0] in PRODUCTION_TARGETS for name in args.targets):
                from .production import production_configuration

                production = stack.enter_context(production_configuration(work_dir))
            procs = stack.enter_context(Processes(work_dir))
            run = Run(args, work_dir, procs, start_fake_fxa(procs), production=production)
            for ref in args.baseline_refs:
                run.baselines[ref] = export_tree(ref, work_dir)
            for phase in args.phases:
                if phase == "scale":
                    phase_scale(run, open_files)
                else:
                    globals()[f"phase_{phase}"](run)
        completed = True
    except KeyboardInterrupt:
        say("\ninterrupted: every started process has been stopped")
        return 130
    finally:
        if run is not None:
            say(f"\n## verdicts ({service}; targets from the issue)")
            for name, figure, met in verdicts(run.results, service):
                mark = "met" if met else ("n/a" if met is None else "MISSED")
                say(f"  {mark:<6} {name}: {figure}")
            say(f"\ntotal {time.monotonic() - started:.0f} s" + ("" if completed else f"; logs kept in {work_dir}"))
            if args.json:
                args.json.write_text(json.dumps(run.results, indent=2))
            if args.plots:
                from .plots import write_plots

                for path in write_plots(run.results, args.plots):
                    say(f"  picture: {path}")
        if completed and not args.keep_logs:
            import shutil

            shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
