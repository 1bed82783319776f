"""Churn in the default run: waves of 1,000 streams against a `serve` process, half read to
the end and half hung up. Memory levels off, fds and upstream connections return to their
baseline, every request has one canonical line and no outcome is misclassified."""

from __future__ import annotations

import pytest

from .churn import churn
from .harness import served_before_hang_up

pytestmark = pytest.mark.load

WAVES = 3
WAVE_SIZE = 1000


async def test_churn_waves_leave_nothing_behind(tmp_path):
    run = await churn(tmp_path, wave_size=WAVE_SIZE, waves=WAVES, seed=3)
    assert run.verdict is not None and run.baseline is not None and run.settled is not None
    for point in run.samples:
        print(point)
    verdict, ids = run.verdict, run.request_ids
    assert verdict.not_exactly_one_line(ids) == []
    assert verdict.errors == []
    lines = {rid: verdict.canonical[rid][0] for rid in ids}
    # A full read is a success; a hang-up is an abort, or a success only when the relay had
    # already finished (its line is older than the hang-up: the client left unread bytes).
    misclassified = {
        rid: line["result"]
        for rid, line in lines.items()
        if not (
            line["result"] == "success"
            if rid not in run.hung_up
            else line["result"] == "abort"
            or (line["result"] == "success" and served_before_hang_up(line, run.results[rid]))
        )
    }
    assert misclassified == {}
    hung_up_served = sum(1 for rid in run.hung_up if lines[rid]["result"] == "success")
    print(f"hung up: {len(run.hung_up)}, of which served in full before leaving: {hung_up_served}")
    assert run.settled.failure == 0
    assert run.settled.abort == len(run.hung_up) - hung_up_served
    assert run.settled.success == len(ids) - len(run.hung_up) + hung_up_served
    # Back to baseline: every client and upstream socket closed (the pool has expired).
    # (The baseline still holds the warm-up's pooled LiteLLM and FxA connections.)
    assert run.settled.upstream_connections == 0
    assert run.settled.fds <= run.baseline.fds
    # Memory levels off: after the first wave has warmed allocators and caches, later
    # waves add less than 10 % (and at most 16 MiB) on top.
    after_first = run.samples[1].rss_mib
    peak_later = max(p.rss_mib for p in run.samples[2:])
    assert peak_later - after_first <= min(16.0, after_first * 0.10), [p.rss_mib for p in run.samples]
