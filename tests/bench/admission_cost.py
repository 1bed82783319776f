"""CPU per new stream: the admission phase's rate measurement alone, interleaved rounds.

    PYTHONPATH=. python -m tests.bench.admission_cost --rounds 3
    PYTHONPATH=. python -m tests.bench.admission_cost --targets aiohttp-gunicorn,aiohttp-bare --baseline-ref main
    PYTHONPATH=. python -m tests.bench.admission_cost --service-env LOG_LEVEL=info   # the default level
    PYTHONPATH=. python -m tests.bench.admission_cost --targets aiohttp-gunicorn-production,aiohttp-gunicorn,aiohttp-bare

What `open_streams --phases admission` measures after its burst, without the burst (which
takes most of that phase's time): per round and target, --held streams open (an event per
second each), the process tree's CPU over 2 s (their own relaying, subtracted), then
--concurrency new streams kept in flight for --seconds, each closed at its first body byte
(`loadgen rate`). CPU per new stream = (CPU in the window - background) / streams admitted,
from the scheduler's nanosecond count. Targets start once and are measured in a rotated
order each round; the figure compared is the median of the per-round ratios to
`aiohttp-bare`, the stack's own floor.
"""

from __future__ import annotations

import argparse
import contextlib
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

from .open_streams import Loadgen, export_tree, percentile, say, table
from .procs import Processes, raise_open_file_limit, terminate_on_sigterm
from .targets import (
    PRODUCTION_TARGETS, PYTHON, add_service_env_option, environment_assignments, python_env, start_fake_fxa, start_paced_upstream,
    start_target,
)

FLOOR = "aiohttp-bare"


def measure(procs: Processes, target: Any, args: argparse.Namespace, label: str) -> dict[str, Any]:
    loadgen = Loadgen(procs, target, args.held, open_timeout=60) if args.held else None
    try:
        time.sleep(1.0)
        quiet_before = target.runtime_seconds()
        time.sleep(2.0)
        background = (target.runtime_seconds() - quiet_before) / 2.0
        cpu_before, delay_before = target.runtime_seconds(), target.run_delay_seconds()
        prober = procs.start(
            f"rate-{label}",
            [PYTHON, "-m", "tests.bench.loadgen", "rate", "--port", str(target.port), "--concurrency",
             str(args.concurrency), "--seconds", str(args.seconds), "--token", target.token, "--content", "rate-{i}"],
            env=python_env(), stdout=subprocess.PIPE,
        )
        stdout, _ = prober.process.communicate(timeout=args.seconds + 60)
        cpu = target.runtime_seconds() - cpu_before
        delay = target.run_delay_seconds() - delay_before
        procs.stop(prober)
    finally:
        if loadgen is not None:
            loadgen.close()
    rate = json.loads(stdout.decode().strip().splitlines()[-1])
    window = rate["seconds"]
    return {
        "per_second": rate["per_second"], "admitted": rate["admitted"],
        "cpu_us_per_stream": 1e6 * (cpu - background * window) / max(1, rate["admitted"]),
        "cpu_percent": 100 * cpu / window, "background_percent": 100 * background,
        "run_delay_percent": 100 * delay / window, "ttfb_p50_ms": 1000 * percentile(rate["ttfb"], 0.5),
        "failures": rate["failures"], "load": os.getloadavg()[0],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.admission_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="aiohttp-gunicorn,aiohttp-bare")
    parser.add_argument("--baseline-ref", help="also run the service targets from this commit's tree, as NAME@REF")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--held", type=int, default=2000, help="streams open while new ones are admitted")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    add_service_env_option(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    service_env = environment_assignments(args.service_env)
    names = [x.strip() for x in args.targets.split(",") if x.strip()]
    if args.baseline_ref:
        names += [f"{name}@{args.baseline_ref}" for name in list(names) if name.startswith("aiohttp-") and name != FLOOR]
    terminate_on_sigterm()
    raise_open_file_limit()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-admission-"))
    say(f"# CPU per new stream ({time.strftime('%Y-%m-%d %H:%M')}, load {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{args.held} open, {args.concurrency} new in flight for {args.seconds:g} s, {args.rounds} rounds"
        f"{'; ' + ' '.join(args.service_env) if args.service_env else ''})")
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with contextlib.ExitStack() as stack:
        production = None
        if any(name.partition("@")[0] in PRODUCTION_TARGETS for name in names):
            from .production import production_configuration

            production = stack.enter_context(production_configuration(work_dir))
        procs = stack.enter_context(Processes(work_dir))
        fxa = start_fake_fxa(procs)
        upstream = start_paced_upstream(procs, ttft=0.0, chunks=90, interval=1.0)
        baselines = {args.baseline_ref: export_tree(args.baseline_ref, work_dir)} if args.baseline_ref else {}
        targets = [start_target(procs, name, upstream_port=upstream, fxa_port=fxa, work_dir=work_dir, baselines=baselines,
                                service_env=service_env, production=production)
                   for name in names]
        for round_index in range(args.rounds):
            shift = round_index % len(targets)
            for target in targets[shift:] + targets[:shift]:
                figures = measure(procs, target, args, f"{target.name}-{round_index}")
                rows[target.name].append(figures)
                say(f"  round {round_index} {target.name:<24} {figures['per_second']:6.0f} new/s, "
                    f"{figures['cpu_us_per_stream']:5.0f} µs CPU per new stream (CPU {figures['cpu_percent']:.0f} %, "
                    f"{figures['background_percent']:.1f} % before; waiting for a CPU {figures['run_delay_percent']:.0f} %; "
                    f"TTFB p50 {figures['ttfb_p50_ms']:.1f} ms; failures {figures['failures'] or 0}; load {figures['load']:.1f})")
                time.sleep(1.0)
    shutil.rmtree(work_dir, ignore_errors=True)  # kept when the run failed (the exception skips this)
    summary = []
    for name in names:
        per_stream = [row["cpu_us_per_stream"] for row in rows[name]]
        ratios = ([ours["cpu_us_per_stream"] / floor["cpu_us_per_stream"] for ours, floor in zip(rows[name], rows[FLOOR])]
                  if FLOOR in rows else [])
        summary.append([name, " / ".join(f"{x:.0f}" for x in per_stream), f"{statistics.median(per_stream):.0f}",
                        " / ".join(f"{x:.2f}" for x in ratios) or "-", f"{statistics.median(ratios):.2f}" if ratios else "-"])
    say("\n" + table(["target", "µs CPU per new stream, per round", "median", f"/ {FLOOR}, per round", "median ratio"], summary))
    say(f"load at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
