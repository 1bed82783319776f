"""Bench only: every garbage collection of this process, timed, to a file.

`tests.bench.smooth` puts this directory first on the service's PYTHONPATH (through
BENCH_SITE_DIR, tests/bench/targets.py) with BENCH_GC_TIMELINE naming a directory: each
process then appends `<pid>` lines of `<monotonic start> <seconds> <generation>` to
`gc-<pid>.log`, so a late event seen by the load generator (same CLOCK_MONOTONIC) can be
matched with the collection that held the worker's loop at the time. Writes are buffered
(flushed at the first collection a second or more after the last flush, and at exit): the
callback makes no system call of its own in the common case.
"""

from __future__ import annotations

import atexit
import gc
import os
import time

_directory = os.environ.get("BENCH_GC_TIMELINE")

if _directory:
    _lines: list[str] = []
    _state = {"started": 0.0, "flushed": time.monotonic(), "pid": 0}

    def _flush() -> None:
        if not _lines:
            return
        with open(os.path.join(_directory, f"gc-{os.getpid()}.log"), "a") as out:
            out.write("".join(_lines))
        _lines.clear()

    def _timed(phase: str, info: dict[str, int]) -> None:
        now = time.monotonic()
        if phase == "start":
            _state["started"] = now
            return
        if _state["pid"] != os.getpid():  # a forked worker starts its own file
            _state["pid"] = os.getpid()
            _lines.clear()
        _lines.append(f"{_state['started']:.6f} {now - _state['started']:.6f} {info['generation']}\n")
        if now - _state["flushed"] >= 1.0:
            _state["flushed"] = now
            _flush()

    gc.callbacks.append(_timed)
    atexit.register(_flush)
