"""Where a new stream's CPU goes, service against the bare relay: by library under load
(`perf`), and system calls per new stream (`strace`).

    PYTHONPATH=. python -m tests.bench.where_cpu_goes                        # the default level
    PYTHONPATH=. python -m tests.bench.where_cpu_goes --service-env LOG_LEVEL=warning

Per target (the service under gunicorn, its one worker, and `aiohttp-bare`):
1. `perf record` samples the process for --seconds while --held streams are open and
   100 new ones are kept in flight (`loadgen rate`, each closed at its first body byte, as
   in `admission_cost`); `perf report --sort dso` gives each library's share of the samples,
   and the shares of the cyclic collector's own functions are summed (GC).
2. `strace -c -f` counts the system calls of --requests sequential new streams
   (`loadgen probe`), per new stream.
A share times the target's CPU per new stream (`admission_cost`) is that library's time per
new stream; the kernel's and the interpreter's compared that way say whether the service's
excess is system work or Python. Needs perf and strace; about a minute.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .instructions import probe
from .open_streams import Loadgen, say, table
from .procs import Processes, raise_open_file_limit, terminate_on_sigterm
from .targets import (
    PYTHON, Target, add_service_env_option, environment_assignments, python_env, start_fake_fxa,
    start_paced_upstream, start_target,
)

TARGETS = ("aiohttp-gunicorn", "aiohttp-bare")
# The cyclic collector's own C functions (Modules/gcmodule.c).
GC_SYMBOLS = ("gc_collect_main", "visit_decref", "visit_reachable", "subtract_refs", "move_unreachable",
              "update_refs", "deduce_unreachable", "move_legacy_finalizers")


def measured_process(target: Target, name: str) -> str:
    """The process that serves: gunicorn's one worker, or the target itself."""
    pid = str(target.child.pid)
    if name == "aiohttp-gunicorn":
        children = subprocess.run(["pgrep", "-P", pid], capture_output=True, text=True, check=False).stdout.split()
        if len(children) != 1:
            raise RuntimeError(f"expected one gunicorn worker under {pid}, found {children}")
        return children[0]
    return pid


def report(data: Path, sort: str) -> dict[str, float]:
    out = subprocess.run(["perf", "report", "-i", str(data), "--sort", sort, "--stdio"], capture_output=True,
                         text=True, check=True).stdout
    shares: dict[str, float] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith("%") and not line.startswith("#"):
            shares[parts[-1]] = shares.get(parts[-1], 0.0) + float(parts[0].rstrip("%"))
    return shares


def sample_under_load(procs: Processes, target: Target, name: str, args: argparse.Namespace, work_dir: Path
                      ) -> tuple[dict[str, float], float]:
    held = Loadgen(procs, target, args.held, open_timeout=60)
    try:
        time.sleep(2.0)
        prober = procs.start(
            f"rate-{name}",
            [PYTHON, "-m", "tests.bench.loadgen", "rate", "--port", str(target.port), "--concurrency", "100",
             "--seconds", str(args.seconds + 2), "--token", target.token, "--content", "rate-{i}"],
            env=python_env(), stdout=subprocess.PIPE,
        )
        time.sleep(1.0)
        data = work_dir / f"perf-{name}.data"
        subprocess.run(["perf", "record", "-F", "2000", "-o", str(data), "-p", measured_process(target, name),
                        "--", "sleep", str(args.seconds)], capture_output=True, check=True, timeout=args.seconds + 60)
        prober.process.communicate(timeout=args.seconds + 60)
        procs.stop(prober)
    finally:
        held.close()
    by_symbol = report(data, "sym")
    gc_share = sum(share for symbol, share in by_symbol.items() if symbol in GC_SYMBOLS)
    return report(data, "dso"), gc_share


def count_system_calls(target: Target, name: str, requests: int, work_dir: Path) -> dict[str, float]:
    probe(target.port, 30)
    out = work_dir / f"strace-{name}.txt"
    tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", measured_process(target, name)],
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        probe(target.port, requests)
        time.sleep(0.5)
    finally:
        tracer.send_signal(2)
        tracer.wait(timeout=30)
    calls: dict[str, float] = collections.Counter()
    for line in out.read_text().splitlines():
        parts = line.split()
        # "% time  seconds  usecs/call  calls  [errors]  syscall"
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            calls[parts[-1]] += int(parts[3]) / requests
    return dict(calls)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.where_cpu_goes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", type=int, default=2000, help="streams open while perf samples")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long perf samples")
    parser.add_argument("--requests", type=int, default=300, help="sequential new streams counted by strace")
    add_service_env_option(parser)
    args = parser.parse_args(argv)
    args.service_env = args.service_env or ["LOG_LEVEL=info"]  # the default level, unlike the other benches
    service_env = environment_assignments(args.service_env)
    terminate_on_sigterm()
    raise_open_file_limit()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-where-cpu-"))
    shares: dict[str, dict[str, float]] = {}
    gc: dict[str, float] = {}
    calls: dict[str, dict[str, float]] = {}
    with Processes(work_dir) as procs:
        fxa = start_fake_fxa(procs)
        upstream = start_paced_upstream(procs, ttft=0.0, chunks=90, interval=1.0)
        for name in TARGETS:
            target = start_target(procs, name, upstream_port=upstream, fxa_port=fxa, work_dir=work_dir,
                                  service_env=service_env)
            shares[name], gc[name] = sample_under_load(procs, target, name, args, work_dir)
            calls[name] = count_system_calls(target, name, args.requests, work_dir)
            procs.stop(target.child)
    say(f"# where a new stream's CPU goes ({' '.join(args.service_env)}; {args.held} open, 100 new in flight)\n")
    libraries = sorted({dso for per in shares.values() for dso in per}, key=lambda dso: -shares[TARGETS[0]].get(dso, 0))
    rows = [[dso, *(f"{shares[name].get(dso, 0.0):.1f} %" for name in TARGETS)] for dso in libraries[:10]]
    rows.append(["(of which the cyclic collector)", *(f"{gc[name]:.2f} %" for name in TARGETS)])
    say(table(["library (perf samples under load)", *TARGETS], rows))
    names = sorted({call for per in calls.values() for call in per}, key=lambda call: -calls[TARGETS[1]].get(call, 0))
    # Rows under 0.05 per new stream (gunicorn's heartbeat) are left out.
    rows = [[call, *(f"{calls[name].get(call, 0.0):.1f}" for name in TARGETS)] for call in names
            if max(calls[name].get(call, 0.0) for name in TARGETS) >= 0.05]
    rows.append(["all", *(f"{sum(calls[name].values()):.1f}" for name in TARGETS)])
    say("\n" + table(["system call, per new stream (strace)", *TARGETS], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
