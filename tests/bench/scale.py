"""20,000 concurrent streams on one two-core "pod": the service under gunicorn with two
workers, counted to completion, and new-request time to first byte with all of them open
next to the same service idle. On demand (several minutes), not part of the test run:

    PYTHONPATH=. python -m tests.bench.scale --streams 20000 --workers 2

RLIMIT_NOFILE's hard limit is 20,000 per process here, so everything that holds many
sockets is split: the streams come from --loadgens processes, and the paced upstream is
--upstreams processes sharing one port with SO_REUSEPORT. A worker holds two sockets per
stream (client and upstream), so two workers of 20,000 descriptors each hold at most
~19,900 streams between them if the kernel spreads connections evenly; a worker out of
descriptors shows up as errors here, not as a hidden cap.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .open_streams import Loadgen, percentile, say
from .procs import Processes, descendants, free_port, raise_open_file_limit, terminate_on_sigterm, wait_for_port
from .targets import CLIENT_TOKEN, PYTHON, Target, service_environ, python_env, start_fake_fxa, warm_up


def open_descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def probe(procs: Processes, target: Target, count: int) -> dict[str, Any]:
    """Sequential fresh requests: time from connect to the first body byte."""
    child = procs.start(
        f"probe-{time.monotonic_ns()}",
        [PYTHON, "-m", "tests.bench.loadgen", "probe", "--count", str(count), "--pause", "0.02",
         "--target", f"service,{target.port},{target.token}"],
        env=python_env(), stdout=subprocess.PIPE,
    )
    stdout, _ = child.process.communicate(timeout=count * 5 + 60)
    procs.stop(child)
    samples = json.loads(stdout.decode().strip().splitlines()[-1])
    times = samples["samples"]["service"]
    return {"p50_ms": 1000 * percentile(times, 0.5), "p99_ms": 1000 * percentile(times, 0.99),
            "max_ms": 1000 * max(times, default=float("nan")), "failures": samples["failures"]["service"],
            "count": len(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--loadgens", type=int, default=4)
    parser.add_argument("--upstreams", type=int, default=4)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between a stream's chunks")
    parser.add_argument("--lifetime", type=float, default=420.0, help="seconds a stream lasts (upstream side)")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--open-timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    terminate_on_sigterm()
    limit = raise_open_file_limit()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-scale-"))
    say(f"# scale: {args.streams} streams, gunicorn with {args.workers} workers, {args.loadgens} load generators, "
        f"{args.upstreams} upstream processes (RLIMIT_NOFILE {limit}; logs {work_dir})")
    result: dict[str, Any] = {"streams": args.streams, "workers": args.workers}
    started = time.monotonic()
    with Processes(work_dir) as procs:
        fxa = start_fake_fxa(procs)
        upstream = free_port()
        chunks = int(args.lifetime / args.interval)
        for index in range(args.upstreams):
            child = procs.start(f"upstream-{index}", [
                PYTHON, "-m", "tests.bench.paced_upstream", "--port", str(upstream), "--reuse-port",
                "--ttft", "0", "--chunks", str(chunks), "--interval", str(args.interval)], env=python_env())
        wait_for_port(upstream, timeout=20, process=child.process)
        time.sleep(1.0)  # every upstream process bound before the first connection
        port = free_port()
        env = service_environ(port, upstream, fxa)
        env.update(GUNICORN_WORKERS=str(args.workers), GUNICORN_WORKER_CLASS="uvloop")
        repo = Path(__file__).resolve().parents[2]
        child = procs.start("gunicorn", [PYTHON, "-m", "gunicorn", "-c", "config/gunicorn.conf.py",
                                         "mlpa_aiohttp.app:app_factory"], env=env, cwd=str(repo))
        wait_for_port(port, timeout=60, process=child.process)
        target = Target("aiohttp-gunicorn", port, CLIENT_TOKEN, child)
        warm_up(target, requests=10)
        result["idle"] = idle = probe(procs, target, args.probes)
        say(f"  idle service: first byte p50 {idle['p50_ms']:.2f} ms, p99 {idle['p99_ms']:.2f} ms "
            f"({idle['failures']} failures; load {os.getloadavg()[0]:.1f})")
        share = [args.streams // args.loadgens + (1 if i < args.streams % args.loadgens else 0) for i in range(args.loadgens)]
        opening = time.monotonic()
        # All load generators open at once, so the streams overlap for their whole life.
        loadgens = [Loadgen(procs, target, count, concurrency=250, open_timeout=args.open_timeout, wait=False)
                    for count in share]
        opened = sum(loadgen.wait_opened()["open"] for loadgen in loadgens)
        open_errors = sum(loadgen.opened["errors"] for loadgen in loadgens)
        result["opened"], result["open_seconds"] = opened, time.monotonic() - opening
        workers = [pid for pid in descendants(child.pid) if pid != child.pid]
        result["worker_descriptors"] = [open_descriptors(pid) for pid in workers]
        result["open_after_opening"] = sum(loadgen.command("stats")["open"] for loadgen in loadgens)
        say(f"  opened {opened}/{args.streams} in {result['open_seconds']:.0f} s ({open_errors} errors), "
            f"{result['open_after_opening']} open at once; worker descriptors "
            f"{result['worker_descriptors']}; load {os.getloadavg()[0]:.1f}")
        result["loaded"] = loaded = probe(procs, target, args.probes)
        still_open = sum(loadgen.command("stats")["open"] for loadgen in loadgens)
        say(f"  with {still_open} open: first byte p50 {loaded['p50_ms']:.2f} ms, p99 {loaded['p99_ms']:.2f} ms "
            f"({loaded['failures']} failures; load {os.getloadavg()[0]:.1f})")
        result["open_during_probe"] = still_open
        remaining = max(30.0, args.lifetime + args.open_timeout - (time.monotonic() - opening) + 30)
        done = [loadgen.command(f"wait_done {remaining:.0f}", timeout=remaining + 30) for loadgen in loadgens]
        for loadgen in loadgens:
            loadgen.close()
        result["completed"] = sum(d["completed"] for d in done)
        result["errors"] = sum(d["errors"] for d in done)
        result["unfinished"] = sum(d["unfinished"] for d in done)
        result["peak_open"] = sum(d["peak_open"] for d in done)
        result["error_samples"] = [sample for d in done for sample in d["error_samples"]][:5]
    say(f"  {result['completed']}/{args.streams} completed, {result['errors']} errors, {result['unfinished']} unfinished, "
        f"peak {result['peak_open']} open at once {result['error_samples'][:2]}")
    verdict = result["errors"] == 0 and result["completed"] == args.streams
    say(f"\n  {'met' if verdict else 'MISSED'} {args.streams} concurrent streams, 0 errors; new-request first byte p99 "
        f"{result['loaded']['p99_ms']:.1f} ms with them open vs {result['idle']['p99_ms']:.1f} ms idle "
        f"(total {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
