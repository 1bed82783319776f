"""What one open stream holds in a worker: resident memory and file descriptors (issue 24
item 5, for pod limits in open streams; docs/scaling.md).

    PYTHONPATH=. python -m tests.bench.footprint                  # 500 warm-up, then 2,000 open
    PYTHONPATH=. python -m tests.bench.footprint --n 1000,3000 --overload

The service under gunicorn (one worker, the shipped config), a paced upstream sending one
event per stream every --interval s (active streams, not silent ones), the fake FxA. A
warm-up wave of --warm-up streams is opened and closed first (so first-request allocations
and the allocator's pools are not charged to the streams), then for each count in --n the
streams are opened, and the worker's RSS (/proc/<pid>/status VmRSS) and open descriptors
(/proc/<pid>/fd) are read against the same process with none open.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Sequence

from .open_streams import Loadgen
from .procs import Processes, descendants, raise_open_file_limit, terminate_on_sigterm
from .targets import start_fake_fxa, start_paced_upstream, start_target


def worker_pid(master: int) -> int:
    """gunicorn's only worker (the deepest process of the tree)."""
    members = descendants(master)
    return members[-1]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle(pid: int, seconds: float = 3.0) -> tuple[int, int]:
    time.sleep(seconds)
    return rss_bytes(pid), open_descriptors(pid)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.footprint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", default="2000", help="comma-separated open-stream counts (2000)")
    parser.add_argument("--warm-up", type=int, default=500)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--overload", action="store_true", help="with OVERLOAD_PROTECTION=true")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.n.split(",")]
    terminate_on_sigterm()
    limit = raise_open_file_limit()
    work_dir = Path(tempfile.mkdtemp(prefix="mlpa-footprint-"))
    print(f"# stream footprint {time.strftime('%Y-%m-%d %H:%M')} UTC; RLIMIT_NOFILE {limit}; load {os.getloadavg()}")
    with Processes(work_dir) as procs:
        upstream = start_paced_upstream(procs, ttft=0.2, chunks=int(600 / args.interval), interval=args.interval)
        fxa = start_fake_fxa(procs)
        env = {"OVERLOAD_PROTECTION": "true"} if args.overload else {}
        target = start_target(procs, "aiohttp-gunicorn", upstream_port=upstream, fxa_port=fxa, work_dir=work_dir,
                              service_env=env)
        pid = worker_pid(target.child.pid)
        warm = Loadgen(procs, target, args.warm_up)
        warm.close()
        for n in counts:
            rss_before, fds_before = settle(pid)
            hold = Loadgen(procs, target, n)
            rss_open, fds_open = settle(pid)
            opened = hold.opened.get("open", n)
            print(f"  {n} streams ({opened} open): RSS {rss_before / 2**20:.1f} -> {rss_open / 2**20:.1f} MiB, "
                  f"{(rss_open - rss_before) / max(opened, 1) / 1024:.1f} KiB per stream; descriptors "
                  f"{fds_before} -> {fds_open}, {(fds_open - fds_before) / max(opened, 1):.2f} per stream; "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
            hold.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
