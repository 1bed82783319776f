"""Process and garbage-collector series, as prometheus-client exposes them by default.

Dashboards built for the reference read `process_*`, `python_gc_*` and `python_info`.
One process (`serve`, or gunicorn without `PROMETHEUS_MULTIPROC_DIR`): prometheus-client's
own collectors on the app's registry, names and labels exactly the defaults.

Several gunicorn workers (`PROMETHEUS_MULTIPROC_DIR`): prometheus-client's multiprocess
mode has no process or GC series (its collectors see only the scraped process), so:

* `process_*` - one series per live worker with a `pid` label (the label multiprocess
  gauges get), read by the scraped worker from `/proc/<pid>` of every sibling worker at
  scrape time with prometheus-client's `ProcessCollector`: exact, no timer. Not summed:
  `sum by (pod) (process_resident_memory_bytes)` gives a pod's total where wanted.
* `python_gc_*` - only a process can read its own collector statistics, so each worker
  copies them into multiprocess counters labelled with its `pid` every
  `GC_SYNC_INTERVAL_SECONDS` (and the scraped worker just before answering). A dead
  worker's counters stay, frozen, until the next deployment empties the directory, as
  prometheus-client keeps every counter of a dead process, so sums never go backwards.
* `python_info` - one series, no `pid`: every worker runs the same interpreter.
"""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

GC_SYNC_INTERVAL_SECONDS = 10.0


def register_single_process(registry: CollectorRegistry) -> None:
    """prometheus-client's default process, GC and platform collectors."""
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)


def register_multiprocess(aggregate: CollectorRegistry, directory: str) -> None:
    """What the aggregated exposition adds to the multiprocess files' series."""
    aggregate.register(WorkerProcessCollector(directory))
    PlatformCollector(registry=aggregate)


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: fields resume after the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def live_worker_pids(directory: str) -> list[int]:
    """This process and its live siblings (same parent) that wrote metrics files."""
    me, parent = os.getpid(), os.getppid()
    pids = {me}
    for path in Path(directory).glob("*.db"):
        suffix = path.stem.rsplit("_", 1)[-1]
        if suffix.isdigit() and int(suffix) != me and _parent_pid(int(suffix)) == parent:
            pids.add(int(suffix))
    return sorted(pids)


class WorkerProcessCollector(Collector):
    """`process_*` of every live worker, labelled `pid`."""

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for pid in live_worker_pids(self._directory):
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                target = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    target.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        return list(merged.values())


class WorkerGCCounters:
    """This worker's `gc.get_stats()` copied into multiprocess counters (label `pid`)."""

    def __init__(self) -> None:
        # A registry of their own: the values live in the multiprocess files, and the
        # app's registry (used without multiprocess mode) has the plain GCCollector.
        registry = CollectorRegistry()
        labels = ("generation", "pid")
        self._counters = {
            "collected": Counter("python_gc_objects_collected", "Objects collected during gc", labels, registry=registry),
            "uncollectable": Counter(
                "python_gc_objects_uncollectable", "Uncollectable objects found during GC", labels, registry=registry
            ),
            "collections": Counter(
                "python_gc_collections", "Number of times this generation was collected", labels, registry=registry
            ),
        }
        self._pid = str(os.getpid())
        self._copied: dict[tuple[str, int], int] = {}
        for generation in range(len(gc.get_stats())):
            for counter in self._counters.values():
                counter.labels(str(generation), self._pid)  # present even while zero
        self.sync()  # a scrape answered by a sibling never sees this worker's GC at 0

    def sync(self) -> None:
        for generation, stats in enumerate(gc.get_stats()):
            for key, counter in self._counters.items():
                delta = stats[key] - self._copied.get((key, generation), 0)
                if delta > 0:
                    counter.labels(str(generation), self._pid).inc(delta)
                    self._copied[(key, generation)] = stats[key]

    async def run(self, interval: float = GC_SYNC_INTERVAL_SECONDS) -> None:
        """Keep the files current for scrapes answered by another worker."""
        while True:
            self.sync()
            await asyncio.sleep(interval)
