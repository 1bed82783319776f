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

Ours beside them: `mlpa_gc_pause_seconds{generation}`, how long each collection held the
event loop (a `gc.callbacks` hook, `GCPauses`). A full collection walks every live object,
so with thousands of open streams it is the longest pause a worker makes
(docs/performance.md). Single process: a histogram; several workers: its sum
and count per worker (`mlpa_gc_pause_seconds_total`, `mlpa_gc_pauses_total`, label `pid`),
copied like the GC counters.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

GC_SYNC_INTERVAL_SECONDS = 10.0
# Young collections take tens of microseconds, full ones with many open streams 10-200 ms.
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class GCPauses(Collector):
    """Time spent in each collection, by generation, from `gc.callbacks`.

    The callback runs inside the collector, where taking a lock is unsafe (a collection can
    start while any metric's lock is held, prometheus-client's included): it only adds to
    plain lists, read when /metrics is scraped."""

    def __init__(self) -> None:
        generations = len(gc.get_stats())
        self.counts = [0] * generations
        self.seconds = [0.0] * generations
        self.buckets = [[0] * (len(GC_PAUSE_BUCKETS) + 1) for _ in range(generations)]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        elapsed = time.perf_counter() - self._started
        generation = info["generation"]
        self.counts[generation] += 1
        self.seconds[generation] += elapsed
        row = self.buckets[generation]
        for index, bound in enumerate(GC_PAUSE_BUCKETS):
            if elapsed <= bound:
                row[index] += 1
                return
        row[-1] += 1

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(
            "mlpa_gc_pause_seconds", "Time each garbage collection held the process, by generation", labels=["generation"]
        )
        for generation, row in enumerate(self.buckets):
            cumulative, buckets = 0, []
            for bound, count in zip((*map(str, GC_PAUSE_BUCKETS), "+Inf"), row):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([str(generation)], buckets, self.seconds[generation])
        return [family]


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

    def __init__(self, pauses: GCPauses | None = None) -> None:
        self._pauses = pauses
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
        self._pause_seconds = Counter(
            "mlpa_gc_pause_seconds", "Time garbage collections held the worker, by generation", labels, registry=registry
        )
        self._pause_count = Counter("mlpa_gc_pauses", "Garbage collections timed, by generation", labels, registry=registry)
        self._copied_pauses: dict[int, tuple[int, float]] = {}
        self._pid = str(os.getpid())
        self._copied: dict[tuple[str, int], int] = {}
        for generation in range(len(gc.get_stats())):
            for counter in (*self._counters.values(), self._pause_seconds, self._pause_count):
                counter.labels(str(generation), self._pid)  # present even while zero
        self.sync()  # a scrape answered by a sibling never sees this worker's GC at 0

    def sync(self) -> None:
        for generation, stats in enumerate(gc.get_stats()):
            for key, counter in self._counters.items():
                delta = stats[key] - self._copied.get((key, generation), 0)
                if delta > 0:
                    counter.labels(str(generation), self._pid).inc(delta)
                    self._copied[(key, generation)] = stats[key]
        if self._pauses is not None:
            for generation, (count, seconds) in enumerate(zip(self._pauses.counts, self._pauses.seconds)):
                copied_count, copied_seconds = self._copied_pauses.get(generation, (0, 0.0))
                if count > copied_count:
                    self._pause_count.labels(str(generation), self._pid).inc(count - copied_count)
                    self._pause_seconds.labels(str(generation), self._pid).inc(seconds - copied_seconds)
                    self._copied_pauses[generation] = (count, seconds)

    async def run(self, interval: float = GC_SYNC_INTERVAL_SECONDS) -> None:
        """Keep the files current for scrapes answered by another worker."""
        while True:
            self.sync()
            await asyncio.sleep(interval)
