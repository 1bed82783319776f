"""Churn: waves of streams against a `serve` process, half read to the end, half hang up
after 0-0.3 s; after every wave the service's RSS, open fds, upstream connections and
event-loop lag are sampled. Used by the default-run churn test and by the soak.

A hung-up stream is one the fake LiteLLM never ends (its `endless` scenario): it can only
end by the service noticing the hang-up, so its outcome is an abort whatever either
process's loop lag. A stream with an end could be relayed in full before a late hang-up
(the client reading behind, or both processes stalled), a success that no clock tells apart
from a missed hang-up.

    python -m tests.load.churn --minutes 10 --wave 1000 --out soak/   # the soak

The soak prints one line of figures per sample and writes `soak.csv` and `soak.png`
(matplotlib, from the `bench` extra) into `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlpa_aiohttp.testing.fake_litellm import Scenario

from .harness import (
    ClientResult,
    Fakes,
    HangUp,
    ServiceProcess,
    Verdict,
    raise_open_file_limit,
    start_fakes,
    start_service,
    stream_client,
)


# In a hung-up client's message: the fake LiteLLM streams to it until the service leaves.
ENDLESS = f"[fake:{Scenario.ENDLESS}]"


@dataclass
class Sample:
    seconds: float
    streams_done: int
    rss_mib: float
    fds: int
    upstream_connections: int
    loop_lag_ms: float
    success: int
    abort: int
    failure: int
    # Live objects after a collection (heap_probe/sitecustomize.py): what RSS, a high-water
    # mark, cannot show.
    objects: int
    blocks: int


@dataclass
class ChurnRun:
    samples: list[Sample] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    hung_up: set[str] = field(default_factory=set)
    results: dict[str, ClientResult] = field(default_factory=dict)
    baseline: Sample | None = None
    settled: Sample | None = None
    verdict: Verdict | None = None


async def loop_lag_ms(service: ServiceProcess) -> float:
    """How late the service answers a trivial request (its event loop's backlog, roughly)."""
    started = time.monotonic()
    await service.get("/health/liveness")
    return (time.monotonic() - started) * 1000


async def sample(service: ServiceProcess, fakes: Fakes, started: float, done: int) -> Sample:
    lag = await loop_lag_ms(service)
    availability = await service.availability()
    heap = await service.heap_counts()
    return Sample(
        seconds=round(time.monotonic() - started, 1),
        streams_done=done,
        rss_mib=round(service.rss_bytes() / 2**20, 1),
        fds=service.open_fds(),
        upstream_connections=fakes.upstream_connections(),
        loop_lag_ms=round(lag, 1),
        success=availability["success"],
        abort=availability["abort"],
        failure=availability["failure"],
        objects=heap["objects"],
        blocks=heap["blocks"],
    )


async def settle(service: ServiceProcess, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = await service.metrics()
        if metrics.get(("mlpa_in_progress_requests", ()), 0) <= 1 and metrics.get(("mlpa_open_streams", ()), 0) == 0:
            return
        await asyncio.sleep(0.1)


async def churn(
    log_dir: Path,
    *,
    wave_size: int,
    waves: int | None = None,
    minutes: float | None = None,
    total_streams: int | None = None,
    seed: int = 1,
    on_sample=None,
) -> ChurnRun:
    """Waves of `wave_size` concurrent streams (half hang up) until `waves` waves, `minutes`
    minutes or `total_streams` streams, whichever is given and comes first."""
    rng = random.Random(seed)
    # Streams of 40 chunks 50 ms apart (2 s): half read them whole; the other half leave
    # endless streams within 0.3 s of their first byte.
    fakes = await start_fakes(ttft=0.05, chunks=40, interval=0.05, keep_requests=2000)
    service = await start_service(fakes, log_dir, heap_probe=True)
    run = ChurnRun()
    try:
        started = time.monotonic()
        warm = await stream_client("churn-warm-up", service.port, None)
        assert warm.complete, warm
        run.request_ids.append("churn-warm-up")
        await settle(service)
        run.baseline = await sample(service, fakes, started, 0)
        run.samples.append(run.baseline)
        if on_sample is not None:
            on_sample(run.baseline)
        done = wave = 0
        deadline = started + minutes * 60 if minutes is not None else None
        while True:
            if waves is not None and wave >= waves:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            if total_streams is not None and done >= total_streams:
                break
            clients = []
            for index in range(wave_size):
                request_id = f"churn-{wave}-{index}"
                hang_up = HangUp(after_seconds=rng.uniform(0, 0.3), reset=index % 4 == 1) if index % 2 else None
                if hang_up is not None:
                    run.hung_up.add(request_id)
                run.request_ids.append(request_id)
                content = "Hello" if hang_up is None else f"Hello {ENDLESS}"
                clients.append(
                    _delayed(rng.uniform(0, 0.5), stream_client(request_id, service.port, hang_up, content=content))
                )
            for result in await asyncio.gather(*clients):
                run.results[result.request_id] = result
            done += wave_size
            wave += 1
            await settle(service)
            point = await sample(service, fakes, started, done)
            run.samples.append(point)
            if on_sample is not None:
                on_sample(point)
        # Pooled upstream connections expire after UPSTREAM_KEEPALIVE_TIMEOUT_SECONDS (4 s);
        # aiohttp's connector looks for expired ones every 4 s.
        expiry = time.monotonic() + 15
        while fakes.upstream_connections() and time.monotonic() < expiry:
            await asyncio.sleep(0.2)
        run.settled = await sample(service, fakes, started, done)
        run.samples.append(run.settled)
        if on_sample is not None:
            on_sample(run.settled)
    finally:
        await asyncio.to_thread(service.stop)
        await fakes.close()
    run.verdict = Verdict.of(service.log_events())
    return run


def misclassified(run: ChurnRun) -> dict[str, str]:
    """Requests whose outcome is wrong: a full read that is not a success, a hang-up (of an
    endless stream) that is not an abort."""
    assert run.verdict is not None
    wrong = {}
    for rid in run.request_ids:
        lines = run.verdict.canonical.get(rid, [])
        result = lines[0].get("result", "none") if len(lines) == 1 else "not_one_line"
        if result != ("abort" if rid in run.hung_up else "success"):
            wrong[rid] = result
    return wrong


def clients_off_script(run: ChurnRun) -> dict[str, ClientResult]:
    """Clients that did not do what their stream was for: a full read that did not get the
    whole stream, a hang-up client that did not hang up."""
    return {
        rid: result
        for rid, result in run.results.items()
        if (result.hung_up if rid in run.hung_up else result.complete) is not True
    }


def summary(run: ChurnRun) -> str:
    assert run.verdict is not None
    outcomes = run.verdict.results(run.request_ids)
    return (
        f"streams={len(run.request_ids)} outcomes={dict(outcomes)} hung_up={len(run.hung_up)} "
        f"error_lines={len(run.verdict.errors)} "
        f"not_one_line={len(run.verdict.not_exactly_one_line(run.request_ids))} "
        f"misclassified={len(misclassified(run))}"
    )


async def _delayed(delay: float, coroutine):
    await asyncio.sleep(delay)
    return await coroutine


def write_figures(run: ChurnRun, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "soak.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(run.samples[0])))
        writer.writeheader()
        for point in run.samples:
            writer.writerow(asdict(point))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = [p.seconds / 60 for p in run.samples]
    fig, axes = plt.subplots(5, 1, figsize=(9, 12), sharex=True)
    series = (
        ("RSS (MiB)", [p.rss_mib for p in run.samples]),
        ("open fds", [p.fds for p in run.samples]),
        ("upstream connections", [p.upstream_connections for p in run.samples]),
        ("event-loop lag (ms)", [p.loop_lag_ms for p in run.samples]),
    )
    for axis, (label, values) in zip(axes, series):
        axis.plot(seconds, values, marker=".")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    for label in ("success", "abort", "failure"):
        axes[4].plot(seconds, [getattr(p, label) for p in run.samples], marker=".", label=label)
    axes[4].set_ylabel("outcomes (cumulative)")
    axes[4].legend()
    axes[4].grid(True, alpha=0.3)
    axes[4].set_xlabel("minutes (samples after each settled wave)")
    fig.suptitle("mlpa-aiohttp soak: waves of streams, half hung up")
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=90)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="run waves for this long")
    parser.add_argument("--wave", type=int, default=1000, help="concurrent streams per wave")
    parser.add_argument("--streams", type=int, default=None, help="stop earlier, after this many streams in all")
    parser.add_argument("--out", type=Path, default=Path("soak-figures"), help="directory for soak.csv and soak.png")
    args = parser.parse_args()
    # The fakes run here and see thousands of hang-ups; their "Error handling request" is noise.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    raise_open_file_limit()
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    def show(point: Sample) -> None:
        print(" ".join(f"{k}={v}" for k, v in asdict(point).items()), flush=True)

    run = asyncio.run(
        churn(log_dir, wave_size=args.wave, minutes=args.minutes, total_streams=args.streams, on_sample=show)
    )
    assert run.verdict is not None
    print(summary(run))
    print(f"plot: {write_figures(run, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
