"""Where an open stream's memory goes: tracemalloc and object counts per open stream.

    PYTHONPATH=. python -m tests.bench.memory_profile --n 2000 [--content "[fake:hang_after_headers] idle"]

The service runs in this process (uvloop, in a thread, so that tracemalloc sees it); the fake
LiteLLM, the fake FxA and the load generator are their own processes, as in
`open_streams`. After a warm-up wave (--warmup, 0 for none), it opens --n streams, then prints the allocation sites
(tracemalloc, grouped by line) and the object types whose counts grew, each divided by the
number of open streams. RSS is printed too; tracemalloc does not see what C libraries
allocate with malloc directly, nor allocator overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import uvloop
from aiohttp import web

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.observability.logging import configure_logging
from mlpa_aiohttp.settings import Settings

from .open_streams import Loadgen
from .procs import Processes, free_port, raise_open_file_limit, wait_for_port
from .targets import CLIENT_TOKEN, MASTER_KEY, UPSTREAM_KEY, Target, start_fake_fxa, start_fake_litellm


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ServiceThread:
    """The service on its own uvloop loop in a thread of this process."""

    def __init__(self, settings: Settings, port: int) -> None:
        self.loop = uvloop.new_event_loop()
        self.runner = web.AppRunner(create_app(settings), handle_signals=False, access_log=None)
        self.port = port
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(60)

    async def _start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, backlog=4096).start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def kernel_tcp_pages() -> int:
    """Pages the kernel holds for TCP socket buffers, machine-wide (/proc/net/sockstat "mem"):
    not in any process's RSS, but paid per open socket all the same."""
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1])
    return 0


def package_of(filename: str) -> str:
    if "site-packages/" in filename:
        return filename.split("site-packages/")[1].split("/")[0].removesuffix(".py")
    if "/mlpa_aiohttp/" in filename:
        return "mlpa_aiohttp"
    return "stdlib (and C code called from it)"


def object_counts() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.memory_profile")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--content", default="[fake:hang_after_headers] idle")
    parser.add_argument("--open-on", choices=("headers", "body"), default="headers")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=500, help="streams of the warm-up wave (0: a fresh process)")
    args = parser.parse_args()
    raise_open_file_limit()
    configure_logging(level="WARNING", json=False)
    with Processes(Path(tempfile.mkdtemp(prefix="mlpa-memprof-"))) as procs:
        upstream = start_fake_litellm(procs, ttft=0.2, chunks=60, interval=1.0)
        fxa = start_fake_fxa(procs)
        port = free_port()
        settings = Settings.from_environ({
            "MLPA_DEBUG": "true", "MLPA_STORE": "memory", "LOG_LEVEL": "warning",
            "LITELLM_API_BASE": f"http://127.0.0.1:{upstream}", "MLPA_VIRTUAL_KEY": UPSTREAM_KEY,
            "MASTER_KEY": MASTER_KEY, "FXA_BASE_URL": f"http://127.0.0.1:{fxa}/v1",
        })
        service = ServiceThread(settings, port)
        service.start()
        wait_for_port(port, timeout=10)
        target = Target("in-process", port, CLIENT_TOKEN, child=None)  # type: ignore[arg-type]
        try:
            if args.warmup:
                Loadgen(procs, target, args.warmup, content=args.content, open_on=args.open_on).close()
                time.sleep(1.0)
            tracemalloc.start(1)
            counts_before, rss_before, kernel_before = object_counts(), rss_bytes(), kernel_tcp_pages()
            before = tracemalloc.take_snapshot()
            loadgen = Loadgen(procs, target, args.n, content=args.content, open_on=args.open_on)
            try:
                time.sleep(2.0)
                open_now = loadgen.command("stats")["open"]
                after = tracemalloc.take_snapshot()
                counts_after, rss_after, kernel_after = object_counts(), rss_bytes(), kernel_tcp_pages()
            finally:
                loadgen.close()
        finally:
            service.stop()
    n = max(open_now, 1)
    stats = after.compare_to(before, "lineno")
    traced = sum(stat.size_diff for stat in stats)
    print(f"{open_now} streams open; RSS +{(rss_after - rss_before) / n / 1024:.1f} KiB per stream "
          f"(tracemalloc's own bookkeeping included); traced Python allocations +{traced / n / 1024:.2f} KiB per stream")
    page = os.sysconf("SC_PAGE_SIZE")
    print(f"kernel TCP buffers, machine-wide (4 sockets per stream here: client and service ends of both "
          f"connections): {(kernel_after - kernel_before) * page / n / 1024:.1f} KiB per stream")
    by_package: collections.Counter[str] = collections.Counter()
    for stat in stats:
        by_package[package_of(stat.traceback[0].filename)] += stat.size_diff
    print("\nby package, bytes per stream: " + ", ".join(
        f"{name} {size / n:.0f}" for name, size in by_package.most_common() if abs(size / n) >= 10))
    print(f"\nallocation sites, bytes per stream (top {args.top}):")
    for stat in stats[: args.top]:
        frame = stat.traceback[0]
        print(f"  {stat.size_diff / n:8.0f} B  {stat.count_diff / n:5.2f} blocks  {frame.filename.split('site-packages/')[-1]}:{frame.lineno}")
    print("\nobjects per stream (growth):")
    grown = sorted(((counts_after[k] - counts_before.get(k, 0), k) for k in counts_after), reverse=True)
    for delta, name in grown[: args.top]:
        if delta > 0:
            print(f"  {delta / n:6.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
