"""Instructions per new stream, counted by valgrind (callgrind): exact and repeatable where CPU
time on this shared machine moves 10-30 % between rounds.

    PYTHONPATH=. python -m tests.bench.instructions                      # bare relay, service
    PYTHONPATH=. python -m tests.bench.instructions --baseline-ref main  # and the service at REF
    PYTHONPATH=. python -m tests.bench.instructions --ablate parse,auth,body,outcome,context,metrics
    PYTHONPATH=. python -m tests.bench.instructions --service-env LOG_LEVEL=info

Each target runs under `valgrind --tool=callgrind --instr-atstart=no` (the service as
`python -m mlpa_aiohttp serve`, the same app a gunicorn worker runs, with the bench's
environment of tests/bench/targets.py); after 30 warm-up requests the count is switched on,
--requests sequential new streams (`loadgen probe`: connect, send, read to the first body
byte, close) are counted, and the total is divided by them. Counted: the target's user-space
instructions only. The kernel's work (connections, syscalls) is the same for every target
(docs/performance.md) and is not in these figures, so a ratio here is larger than
the same ratio in CPU time. `--ablate STEP` adds a service target with that step taken away
(tests/bench/ablations/sitecustomize.py lists the steps; `a+b` takes both): its difference to
the service is that step's cost. About 10 s per target. Needs valgrind.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .open_streams import export_tree, say, table
from .procs import Processes, free_port, wait_for_port
from .targets import (
    CLIENT_TOKEN, PYTHON, REPO_ROOT, _service_env, add_service_env_option, environment_assignments, python_env,
    start_fake_fxa, start_paced_upstream,
)

ABLATIONS_DIR = Path(__file__).resolve().parent / "ablations"
WARM_UP_REQUESTS = 30


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


def count(procs: Processes, name: str, argv: list[str], env: dict[str, str], port: int, requests: int,
          work_dir: Path, cwd: Path) -> float:
    out = work_dir / f"callgrind.{name.replace('/', '_')}"
    child = procs.start(
        name, ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *argv],
        env=env, cwd=str(cwd),
    )
    try:
        wait_for_port(port, timeout=300, process=child.process)
        probe(port, WARM_UP_REQUESTS)
        pid = str(child.pid)
        for command in (["-i", "on"], ["-z"]):
            subprocess.run(["callgrind_control", *command, pid], check=True, capture_output=True, timeout=60)
        probe(port, requests)
        subprocess.run(["callgrind_control", "-d", "counted", pid], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while not (dumps := sorted(work_dir.glob(f"{out.name}.*"))) and time.monotonic() < deadline:
            time.sleep(0.2)
        return counted_instructions(dumps[-1]) / requests
    finally:
        procs.stop(child, grace=20)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--baseline-ref", help="also count the service from this commit's tree")
    parser.add_argument("--ablate", default="", help="comma-separated steps, each a target of its own; a+b for both")
    add_service_env_option(parser)
    args = parser.parse_args(argv)
    service_env = environment_assignments(args.service_env)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (with callgrind_control) is needed")
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-instructions-"))
    rows: list[tuple[str, float]] = []
    with Processes(work_dir) as procs:
        fxa = start_fake_fxa(procs)
        upstream = start_paced_upstream(procs, ttft=0.0, chunks=90, interval=1.0)

        def service(name: str, root: Path, ablate: str = "") -> None:
            port = free_port()
            env = _service_env(port, upstream, fxa, root)
            env.update(service_env)
            if ablate:
                env["PYTHONPATH"] = f"{ABLATIONS_DIR}:{env['PYTHONPATH']}"
                env["MLPA_BENCH_ABLATE"] = ablate.replace("+", ",")
            rows.append((name, count(procs, name, [PYTHON, "-m", "mlpa_aiohttp", "serve"], env, port,
                                     args.requests, work_dir, root)))
            say(f"  {name:<28} {rows[-1][1] / 1000:8.1f} k instructions per new stream")

        port = free_port()
        rows.append(("aiohttp-bare", count(
            procs, "aiohttp-bare",
            [PYTHON, "-m", "tests.bench.peers.aiohttp_bare", "--port", str(port), "--upstream", f"http://127.0.0.1:{upstream}"],
            python_env(), port, args.requests, work_dir, REPO_ROOT)))
        say(f"  {'aiohttp-bare':<28} {rows[-1][1] / 1000:8.1f} k instructions per new stream")
        service("service", REPO_ROOT)
        if args.baseline_ref:
            service(f"service@{args.baseline_ref}", export_tree(args.baseline_ref, work_dir))
        for step in filter(None, (s.strip() for s in args.ablate.split(","))):
            service(f"service without {step}", REPO_ROOT, step)
    bare = rows[0][1]
    ours = dict(rows)["service"]
    say("\n" + table(
        ["target", "k instructions per new stream", "/ aiohttp-bare", "step's own cost"],
        [[name, f"{value / 1000:.1f}", f"{value / bare:.2f}",
          f"{(ours - value) / 1000:.1f} k" if name.startswith("service without") else "-"] for name, value in rows],
    ))
    shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
