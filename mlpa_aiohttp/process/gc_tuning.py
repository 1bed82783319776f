"""The cyclic garbage collector, set for a heap of long-lived streams (docs/performance.md).

With CPython's default thresholds (700, 10, 10) every object a new stream makes that is
still alive at a young collection (the stream's request, its upstream call, its frames:
a stream lives for hundreds of milliseconds) is promoted, and promoted objects soon trigger
a full collection, which walks every live object: the modules and the app made at start-up
and every open stream. With 1,000 streams open that held the event loop 110-250 ms at a
time, and every open stream's next event waited for it. Two changes, applied once the app
has started (`app.py` calls `settle_heap` in `on_startup`, after the cleanup contexts, so
under gunicorn in the worker, and under `serve`):

* `gc.freeze()`: what exists once the app is ready (imported modules, settings, routes,
  pools, the metrics registry) lives for the process's life; frozen, no collection walks
  it again. Collected first, so nothing freed at start-up is frozen.
* a young-generation threshold of GC_YOUNG_THRESHOLD allocations (default 10,000, CPython's
  700): fewer of a new stream's transient objects are alive at a young collection, so
  fewer are promoted and full collections become rare. A young collection then walks up to
  that many objects (a few milliseconds; 50,000 measured 45 ms with 1,000 streams open).

The third part is in the relay: a finished stream leaves no reference cycle
(tests/unit/test_request_garbage.py), so its objects are freed when it ends and the
threshold counts only what is still alive.
"""

from __future__ import annotations

import gc


def settle_heap(young_threshold: int, *, freeze: bool) -> None:
    """Collect, freeze what is alive (if `freeze`), and set the young threshold (0: keep
    CPython's)."""
    if freeze:
        gc.collect()
        gc.freeze()
    if young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
