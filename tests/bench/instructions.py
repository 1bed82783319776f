"""Instructions per new stream and per relayed SSE event, counted by valgrind (callgrind):
exact and repeatable where CPU time on this shared machine moves 10-30 % between rounds.

    PYTHONPATH=. python -m tests.bench.instructions                      # bare relay, service
    PYTHONPATH=. python -m tests.bench.instructions --production         # and production's configuration
    PYTHONPATH=. python -m tests.bench.instructions --production-parts   # and what each of its parts adds
    PYTHONPATH=. python -m tests.bench.instructions --traffic-contracts  # and with traffic contracts on
    PYTHONPATH=. python -m tests.bench.instructions --fleet-cap          # and STREAM_CAP_SCOPE=fleet on a Redis
    PYTHONPATH=. python -m tests.bench.instructions --baseline-ref main  # and the service at REF
    PYTHONPATH=. python -m tests.bench.instructions --baseline-ref a23f4a3 --baseline-env RELAY_FAST_PATH=true
    PYTHONPATH=. python -m tests.bench.instructions --service-env LOG_LEVEL=info
    PYTHONPATH=. python -m tests.bench.instructions --counts event --streams 200 --events 5   # per event only

Each target runs under `valgrind --tool=callgrind --instr-atstart=no` (the service as
`python -m mlpa_aiohttp serve`, the same app a gunicorn worker runs, with the bench's
environment of tests/bench/targets.py) and is counted twice, each count between two marks
(`callgrind_control -i on`, `-z`, then `-d`), the counting off outside them:

* per new stream: after 30 warm-up requests, --requests sequential new streams (`loadgen
  probe`: connect, send, read to the first body byte, close), divided by them;
* per event: --streams streams are opened and get their first event (the role delta); then
  the paced upstream (--held-events, tests/bench/paced_upstream.py) sends --events content
  deltas to each, one write every --gap seconds taking the streams in turn, twice: once to
  warm the instrumentation up, then counted, from just before the signal until the client
  has received every event of the pass. The whole worker's work for one event is in it: the
  wake-up, the upstream socket's read, aiohttp's client parser, the relay, the write towards
  the client. Divided by the events.

Counted: the target's user-space instructions only. The kernel's work (connections,
syscalls) is the same for every target (docs/performance.md) and is not in these
figures, so a ratio here is larger than the same ratio in CPU time. About 30 s per target.
Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .open_streams import Loadgen, export_tree, say, table
from .procs import Child, Processes, free_port, wait_for_port
from .targets import (
    CLIENT_TOKEN, PYTHON, REPO_ROOT, Target, add_service_env_option, environment_assignments, python_env,
    service_environ, start_fake_fxa, start_paced_upstream_child,
)

WARM_UP_REQUESTS = 30
COUNTS = ("stream", "event")
BARE = "aiohttp-bare"
SERVICE = "service"
PRODUCTION = "service, production"
CONTRACTS = "service, traffic contracts"
CONTRACTS_ENFORCING = "service, traffic contracts enforcing"
# Limits no bench reaches, so that each check reads the counters (a dimension without limits
# is not read) and no request is refused.
_UNREACHED_LIMIT = str(10**12)


@contextmanager
def traffic_contracts_environ() -> Iterator[dict[str, str]]:
    """Traffic contracts on (observational), against a throwaway Redis on loopback: the
    variables to add to a service's environment. Two round trips per request (the check, then
    the count), none per event. The Redis bound is generous: under valgrind the service's own
    side of a call is slow, and a timed-out call would skip Redis and count less."""
    from ..support.redis_server import ThrowawayRedis

    with ThrowawayRedis() as server:
        yield {
            "ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT": "true",
            "REDIS_HOST": server.host,
            "REDIS_PORT": str(server.port),
            "REDIS_TIMEOUT_MS": "5000",
            "TOTAL_TRAFFIC_CONTRACT_RPM_LIMIT": _UNREACHED_LIMIT,
            "TOTAL_TRAFFIC_CONTRACT_TPM_LIMIT": _UNREACHED_LIMIT,
            "SMART_WINDOW_TRAFFIC_CONTRACT_RPM_LIMIT": _UNREACHED_LIMIT,
            "SMART_WINDOW_TRAFFIC_CONTRACT_TPM_LIMIT": _UNREACHED_LIMIT,
        }


FLEET_CAP = "service, fleet cap"
# Every bench stream is one user's (one token): a cap above the bench's concurrency, so each new
# stream takes and releases a lease and none is refused; counted across the fleet in Redis.
# A lease lifetime of an hour keeps the one renewal per worker per lifetime/3 (a cost per
# interval, not per stream or event) out of the counted windows, which valgrind stretches
# to tens of seconds: with 30 s it added 2.5 k instructions per counted event.
FLEET_CAP_ENV = {"MAX_CONCURRENT_STREAMS_PER_USER": "1000", "STREAM_CAP_SCOPE": "fleet", "STREAM_LEASE_SECONDS": "3600"}


@dataclass(frozen=True)
class Workload:
    """What each target is counted on."""

    counts: tuple[str, ...] = COUNTS
    requests: int = 200
    # Few streams, many events each: the silence watch's tick (every 5 s) walks every open
    # stream, and this keeps its share of a window small (docs/performance.md).
    streams: int = 20
    events: int = 25
    gap: float = 0.005


@dataclass
class Figures:
    """One target's counts: instructions per new stream and per event (None: not counted)."""

    name: str
    per_stream: float | None = None
    per_event: float | None = None
    seconds: float = 0.0  # how long the target took, start to stop


def probe(port: int, requests: int) -> None:
    subprocess.run(
        [PYTHON, "-m", "tests.bench.loadgen", "probe", "--target", f"t,{port},{CLIENT_TOKEN}",
         "--count", str(requests), "--pause", "0.002"],
        env=python_env(), cwd=str(REPO_ROOT), check=True, capture_output=True, timeout=600,
    )


def counted_instructions(dump: Path) -> int:
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


class Callgrind:
    """One target under callgrind, counting only inside `counted`."""

    def __init__(self, procs: Processes, name: str, argv: list[str], env: dict[str, str], port: int,
                 work_dir: Path, cwd: Path) -> None:
        self.name = name
        self.port = port
        self.out = work_dir / f"callgrind.{name.replace('/', '_').replace(' ', '_').replace(',', '')}"
        self.child: Child = procs.start(
            name, ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={self.out}", *argv],
            env=env, cwd=str(cwd),
        )
        self._dumps = 0
        wait_for_port(port, timeout=300, process=self.child.process)

    def control(self, *command: str) -> None:
        subprocess.run(["callgrind_control", *command, str(self.child.pid)], check=True, capture_output=True, timeout=60)

    def counted(self, action: Callable[[], None], warm_up: Callable[[], None] | None = None) -> int:
        """The instructions the target ran while `action` ran. `warm_up` runs first, with the
        instrumentation on but not counted: switching it on makes valgrind translate the
        code anew, which slows the target for a while."""
        self.control("-i", "on")
        if warm_up is not None:
            warm_up()
        self.control("-z")
        action()
        self._dumps += 1
        self.control("-d", f"count-{self._dumps}")
        self.control("-i", "off")
        dump = Path(f"{self.out}.{self._dumps}")
        deadline = time.monotonic() + 30
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return counted_instructions(dump)

    def as_target(self) -> Target:
        return Target(self.name, self.port, CLIENT_TOKEN, self.child)


def count_per_stream(target: Callgrind, requests: int) -> float:
    return target.counted(lambda: probe(target.port, requests)) / requests


def count_per_event(procs: Processes, target: Callgrind, upstream: Child, workload: Workload) -> float:
    """Two passes of the upstream's events: the first warms the instrumentation up (a target
    slowed by it falls behind the pacing and takes several events per wake-up, which costs
    less per event), the second is counted."""
    streams, events = workload.streams, workload.events
    loadgen = Loadgen(procs, target.as_target(), streams, open_timeout=120)
    try:
        if loadgen.opened["open"] != streams:
            raise RuntimeError(f"{target.name}: {loadgen.opened['open']}/{streams} streams opened: {loadgen.opened}")
        time.sleep(0.5)  # every stream's first event fully handled before the count starts
        # Generous: the events are paced at --gap; valgrind and a busy machine slow the relay.
        patience = 60 + 10 * streams * events * workload.gap

        def relay_pass() -> None:
            expected = loadgen.command("stats")["events"] + streams * events
            os.kill(upstream.pid, signal.SIGUSR1)
            deadline = time.monotonic() + patience
            while (received := loadgen.command("stats")["events"]) < expected:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{target.name}: {received - expected + streams * events} of "
                                       f"{streams * events} events relayed in {patience:.0f} s")
                time.sleep(0.1)
            # The relay's bookkeeping of the last event runs after its write has reached the client,
            # and the upstream takes a next signal only once its pass is over.
            time.sleep(0.3)
            received = loadgen.command("stats")["events"]
            if received != expected:
                raise RuntimeError(f"{target.name}: {received - expected} events more than sent")

        total = target.counted(relay_pass, warm_up=relay_pass)
        still_open = loadgen.command("stats")["open"]
        if still_open != streams:
            raise RuntimeError(f"{target.name}: {still_open}/{streams} streams open after the count")
        return total / (streams * events)
    finally:
        loadgen.close()


@contextmanager
def counting_run(work_dir: Path, workload: Workload) -> Iterator[CountingRun]:
    """The fakes every target of one run shares: FxA and the paced upstream (held mode)."""
    with Processes(work_dir) as procs:
        fxa = start_fake_fxa(procs)
        upstream_port, upstream = start_paced_upstream_child(
            procs, ttft=0.0, chunks=0, interval=1.0, held_events=workload.events, held_gap=workload.gap)
        yield CountingRun(procs, work_dir, workload, fxa, upstream_port, upstream)


@dataclass
class CountingRun:
    procs: Processes
    work_dir: Path
    workload: Workload
    fxa_port: int
    upstream_port: int
    upstream: Child

    def count(self, name: str, argv: list[str], env: dict[str, str], port: int, cwd: Path = REPO_ROOT) -> Figures:
        started = time.monotonic()
        target = Callgrind(self.procs, name, argv, env, port, self.work_dir, cwd)
        figures = Figures(name)
        try:
            probe(port, WARM_UP_REQUESTS)
            if "stream" in self.workload.counts:
                figures.per_stream = count_per_stream(target, self.workload.requests)
            if "event" in self.workload.counts:
                figures.per_event = count_per_event(self.procs, target, self.upstream, self.workload)
        finally:
            self.procs.stop(target.child, grace=20)
        figures.seconds = time.monotonic() - started
        return figures

    def bare(self) -> Figures:
        port = free_port()
        return self.count(BARE, [PYTHON, "-m", "tests.bench.peers.aiohttp_bare", "--port", str(port),
                                 "--upstream", f"http://127.0.0.1:{self.upstream_port}"], python_env(), port)

    def service(self, name: str, env_for: Callable[[int], dict[str, str]], root: Path = REPO_ROOT) -> Figures:
        """The service (`serve`) from `root`'s tree; `env_for(port)` is its environment."""
        port = free_port()
        return self.count(name, [PYTHON, "-m", "mlpa_aiohttp", "serve"], env_for(port), port, root)

    def service_env(self, port: int, root: Path = REPO_ROOT, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = service_environ(port, self.upstream_port, self.fxa_port, root)
        env.update(extra or {})
        return env


@contextmanager
def fleet_cap_redis() -> Iterator[dict[str, str]]:
    """A throwaway Redis on loopback (tests/support/redis_server.py) and the service variables
    that turn the fleet-wide stream cap on against it."""
    from tests.support.redis_server import ThrowawayRedis

    with ThrowawayRedis() as server:
        yield {**FLEET_CAP_ENV, **server.environ()}


def redis_calls(environ: Mapping[str, str]) -> dict[str, int]:
    """Commands the Redis of `environ` has run, by name (INFO commandstats): how many calls
    the fleet cap made for the streams and events counted."""
    import redis

    client = redis.Redis(host=environ["REDIS_HOST"], port=int(environ["REDIS_PORT"]))
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(values["calls"]) for name, values in stats.items()}


def describe(figures: Figures) -> str:
    parts = []
    if figures.per_stream is not None:
        parts.append(f"{figures.per_stream / 1000:8.1f} k per new stream")
    if figures.per_event is not None:
        parts.append(f"{figures.per_event / 1000:7.2f} k per event")
    return f"  {figures.name:<40} " + ", ".join(parts) + f" ({figures.seconds:.0f} s)"


def _ratio(value: float | None, floor: float | None) -> str:
    return "-" if value is None or not floor else f"{value / floor:.3f}"


def _thousands(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value / 1000:.{digits}f}"


def report(rows: Sequence[Figures], bare: Figures) -> str:
    """The table: each target's counts and their ratios to the bare relay's."""
    return table(
        ["target", "k instructions per new stream", "/ bare", "k instructions per event", "/ bare"],
        [[row.name, _thousands(row.per_stream, 1), _ratio(row.per_stream, bare.per_stream),
          _thousands(row.per_event, 2), _ratio(row.per_event, bare.per_event)]
         for row in rows],
    )


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--counts", default=",".join(COUNTS), help="stream (per new stream), event (per event), or both")
    parser.add_argument("--requests", type=int, default=Workload.requests, help="new streams counted")
    parser.add_argument("--streams", type=int, default=Workload.streams, help="streams open while events are counted")
    parser.add_argument("--events", type=int, default=Workload.events, help="events counted on each of them")
    parser.add_argument("--gap", type=float, default=Workload.gap, help="seconds between two upstream writes")


def workload_of(args: argparse.Namespace) -> Workload:
    counts = tuple(name.strip() for name in args.counts.split(",") if name.strip())
    if not counts or set(counts) - set(COUNTS):
        raise SystemExit(f"--counts: choose from {', '.join(COUNTS)}")
    return Workload(counts, args.requests, args.streams, args.events, args.gap)


def require_valgrind() -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (with callgrind_control) is needed")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_options(parser)
    parser.add_argument("--baseline-ref", help="also count the service from this commit's tree")
    parser.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable for the baseline's service only (an older tree's opt-in setting)")
    parser.add_argument("--production", action="store_true",
                        help="also count the service in production's configuration (tests/bench/production.py)")
    parser.add_argument("--production-parts", action="store_true",
                        help="also count production's configuration one part at a time (each row adds one)")
    parser.add_argument("--traffic-contracts", action="store_true",
                        help="also count the service with traffic contracts on, observing and enforcing, against a "
                             "throwaway Redis")
    parser.add_argument("--fleet-cap", action="store_true",
                        help="also count the service with STREAM_CAP_SCOPE=fleet against a throwaway Redis on loopback")
    parser.add_argument("--keep-dumps", type=Path, metavar="DIR",
                        help="copy callgrind's dumps here (callgrind_annotate reads them per function)")
    add_service_env_option(parser)
    args = parser.parse_args(argv)
    workload = workload_of(args)
    service_env = environment_assignments(args.service_env)
    baseline_env = environment_assignments(args.baseline_env)
    require_valgrind()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-instructions-"))
    say(f"# instructions ({time.strftime('%Y-%m-%d %H:%M')}; {workload.requests} new streams; "
        f"{workload.streams} streams × {workload.events} events, one write per {workload.gap * 1000:g} ms"
        f"{'; ' + ' '.join(args.service_env) if args.service_env else ''})")
    rows: list[Figures] = []

    def add(figures: Figures) -> None:
        rows.append(figures)
        say(describe(figures))

    with ExitStack() as stack:
        run = stack.enter_context(counting_run(work_dir, workload))
        production = None
        if args.production or args.production_parts:
            from .production import production_configuration

            production = stack.enter_context(production_configuration(work_dir))
        add(run.bare())
        add(run.service(SERVICE, lambda port: run.service_env(port, extra=service_env)))
        if args.traffic_contracts:
            contracts = stack.enter_context(traffic_contracts_environ())
            add(run.service(CONTRACTS, lambda port: run.service_env(port, extra={**service_env, **contracts})))
            enforcing = {**service_env, **contracts, "TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT": "true"}
            add(run.service(CONTRACTS_ENFORCING, lambda port: run.service_env(port, extra=enforcing)))
        if args.baseline_ref:
            tree = export_tree(args.baseline_ref, work_dir)
            label = f"service@{args.baseline_ref}{' ' + ' '.join(args.baseline_env) if args.baseline_env else ''}"
            add(run.service(label, lambda port: run.service_env(port, tree, {**service_env, **baseline_env}), tree))
        if production is not None:
            from .production import PRODUCTION_PARTS

            steps = [PRODUCTION_PARTS[:i] for i in range(len(PRODUCTION_PARTS))] if args.production_parts else []
            for parts in steps:
                label = "production: info, debug off" + "".join(f" + {part}" for part in parts)
                add(run.service(label, lambda port, parts=parts: production.environ(
                    port, run.upstream_port, run.fxa_port, parts)))
            add(run.service(PRODUCTION, lambda port: production.environ(port, run.upstream_port, run.fxa_port)))
        if args.fleet_cap:
            redis_env = stack.enter_context(fleet_cap_redis())
            add(run.service(FLEET_CAP, lambda port: run.service_env(port, extra={**service_env, **redis_env})))
            calls = redis_calls(redis_env)
            say(f"  Redis calls of the fleet cap over the whole target (warm-up, counts, events): {calls}")
    say("\n" + report(rows, rows[0]))
    if args.keep_dumps:
        args.keep_dumps.mkdir(parents=True, exist_ok=True)
        for dump in work_dir.glob("callgrind.*"):
            shutil.copy(dump, args.keep_dumps)
        say(f"dumps in {args.keep_dumps}, numbered per target in the order counted (new streams, then events)")
    shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
