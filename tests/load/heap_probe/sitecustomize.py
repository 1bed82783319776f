"""Test-only: lets the churn test count the service's live objects, which RSS cannot show.

Loaded as a `sitecustomize` when this directory leads the service's PYTHONPATH
(tests/load/harness.py, `heap_probe=True`); does nothing unless MLPA_TEST_HEAP_PROBE names a
file. On SIGUSR2 the process collects its garbage, then writes the number of objects the
collector tracks (start-up's, frozen by the service, are not among them) and of the
allocator's blocks in use to that file, as JSON. Never loaded
by the service outside the tests.

RSS is a high-water mark (the allocator keeps what a busier wave needed), so it moves with
how many connections a wave happened to hold at once; live objects go back down when they
are freed, so a leak is what stays.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys

_PATH = os.environ.get("MLPA_TEST_HEAP_PROBE")


def _write_counts(signum: int, frame: object) -> None:
    gc.collect()
    counts = {"objects": len(gc.get_objects()), "blocks": sys.getallocatedblocks()}
    partial = f"{_PATH}.partial"
    with open(partial, "w") as out:
        json.dump(counts, out)
    os.replace(partial, _PATH)


if _PATH:
    signal.signal(signal.SIGUSR2, _write_counts)
