"""Churn in the default run: waves of 1,000 streams against a `serve` process, half read to
the end and half hung up. Memory levels off, fds and upstream connections return to their
baseline, every request has one canonical line and no outcome is misclassified."""

from __future__ import annotations

import pytest

from .churn import churn, misclassified, summary

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
    # already finished (its outcome is older than the hang-up: the client left unread bytes).
    assert misclassified(run) == {}
    print(summary(run))
    hung_up_served = sum(1 for rid in run.hung_up if lines[rid]["result"] == "success")
    print(f"hung up: {len(run.hung_up)}, of which served in full before leaving: {hung_up_served}")
    assert run.settled.failure == 0
    assert run.settled.abort == len(run.hung_up) - hung_up_served
    assert run.settled.success == len(ids) - len(run.hung_up) + hung_up_served
    # Back to baseline: every client and upstream socket closed (the pool has expired).
    # (The baseline still holds the warm-up's pooled LiteLLM and FxA connections.)
    assert run.settled.upstream_connections == 0
    assert run.settled.fds <= run.baseline.fds
    # Memory levels off: once two waves have warmed allocators and pools, the later waves
    # grow RSS by less than 4 KiB per stream (a leak of anything per stream would show).
    warmed = run.samples[2].rss_mib
    later_streams = (WAVES - 2) * WAVE_SIZE
    growth_kib = (max(p.rss_mib for p in run.samples[3:]) - warmed) * 1024
    print(f"RSS after each wave {[p.rss_mib for p in run.samples[1:-1]]} MiB; later waves: {growth_kib / later_streams:.2f} KiB/stream")
    assert growth_kib <= 4 * later_streams, [p.rss_mib for p in run.samples]
