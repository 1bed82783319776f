"""PNG pictures of a benchmark run's figures (what `open_streams --plots DIR` writes).

    PYTHONPATH=. python -m tests.bench.plots results.json DIR   # redraw from a saved --json

One picture per phase that has figures: CPU against open streams per target, µs of CPU per
relayed event against the event rate, RSS per open stream against the number of streams,
time to first byte of each stream of an admission burst against the moment it was
offered, and the overload run (tests/bench/overload.py): each new stream's wait by outcome
and the open streams' event delays, per mode. Small files (about 100 dpi): docs/performance.md
shows the admission burst's, as docs/bench-burst-ttfb.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Colours and markers stay with a target across pictures.
STYLE = {
    "aiohttp-gunicorn": ("tab:blue", "o"),
    "aiohttp-serve": ("tab:cyan", "s"),
    "aiohttp-gunicorn-fast": ("tab:olive", "P"),
    "aiohttp-gunicorn-asyncio": ("tab:pink", "h"),
    "aiohttp-bare": ("tab:purple", "^"),
    "nginx": ("tab:green", "D"),
    "fastapi-poll": ("tab:red", "v"),
    "fastapi-receive": ("tab:orange", "<"),
    "fastapi-receive-bare": ("tab:brown", ">"),
}


def _style(name: str) -> tuple[str, str]:
    base, _, ref = name.partition("@")
    colour, marker = STYLE.get(base, ("tab:gray", "x"))
    return ("tab:gray" if ref else colour), marker


def write_plots(results: dict[str, Any], directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(figure: Any, name: str) -> None:
        path = directory / name
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)

    if results.get("open"):
        figure, axes = plt.subplots(figsize=(7, 4.2))
        counts = sorted(results["open"], key=int)
        names = sorted({name for n in counts for name in results["open"][n]})
        for name in names:
            points = [(int(n), results["open"][n][name]["percent"]) for n in counts if name in results["open"][n]]
            colour, marker = _style(name)
            axes.plot(*zip(*points), marker=marker, color=colour, label=name)
        axes.set(xlabel="open streams (1 chunk/s each)", ylabel="CPU, % of one core", title="CPU against open streams")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        save(figure, "bench-open-cpu.png")

    if results.get("chunk_rates"):
        figure, axes = plt.subplots(figsize=(7, 4.2))
        rates = sorted(results["chunk_rates"], key=float)
        names = sorted({name for rate in rates for name in results["chunk_rates"][rate]})
        for name in names:
            points = [(results["chunk_rates"][rate][name]["events_per_s"], results["chunk_rates"][rate][name]["us_per_event"])
                      for rate in rates if name in results["chunk_rates"][rate]]
            colour, marker = _style(name)
            axes.plot(*zip(*points), marker=marker, color=colour, label=name)
        axes.set(xlabel="relayed SSE events per second", ylabel="µs of CPU per event", title="CPU per relayed event")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        save(figure, "bench-per-event.png")

    if results.get("memory"):
        figure, axes = plt.subplots(figsize=(7, 4.2))
        series: dict[str, list[tuple[int, float]]] = {}
        for key, figures in results["memory"].items():
            name, kind_at = key.split("/", 1)
            kind = kind_at.rsplit("@", 1)[0]
            series.setdefault(f"{name} ({kind})", []).append((figures["streams"], figures["kib_per_stream"]))
        for label, points in sorted(series.items()):
            colour, marker = _style(label.split(" ", 1)[0])
            axes.plot(*zip(*sorted(points)), marker=marker, color=colour, label=label,
                      linestyle="-" if "(silent)" in label else ":")
        axes.set(xlabel="open streams", ylabel="RSS growth per stream, KiB", title="Memory per open stream")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
        save(figure, "bench-memory.png")

    admission = results.get("admission")
    if admission and admission.get("burst"):
        figure, axes = plt.subplots(figsize=(7, 4.2))
        for name, rounds in admission["burst"].items():
            if not rounds:
                continue
            first = rounds[0]
            points = [(offset, 1000 * ttfb) for offset, ttfb in zip(first["offsets"], first["ttfb"]) if ttfb is not None]
            colour, _marker = _style(name)
            lost = first["lost"]
            axes.scatter(*zip(*points), s=2, color=colour, alpha=0.5,
                         label=f"{name}: {first['ListenOverflows']} overflows, {lost} lost")
        axes.set_yscale("log")
        axes.set(xlabel="offered at, s from the burst's start", ylabel="time to first byte, ms",
                 title=f"Admission: {admission['n']} new streams offered in {admission['seconds']:.0f} s")
        axes.grid(alpha=0.3, which="both")
        axes.legend(fontsize=7, markerscale=4)
        save(figure, "bench-admission.png")

    overload = results.get("overload")
    if overload and overload.get("runs"):
        run = overload["runs"][0]
        modes = list(run)
        figure, grid = plt.subplots(2, len(modes), figsize=(3.6 * len(modes), 6.4), squeeze=False)
        outcome_colours = {"served": "tab:blue", "shed": "tab:green", "failed": "tab:red"}
        for column, mode in enumerate(modes):
            result = run[mode]
            axes = grid[0][column]
            for outcome, colour in outcome_colours.items():
                points = [(offset, wait) for offset, kind, wait in result["offer"]["samples"] if kind == outcome]
                if points:
                    axes.scatter(*zip(*points), s=2, color=colour, alpha=0.4, label=outcome)
            axes.axhline(2.0, color="black", linewidth=0.8, linestyle="--")
            axes.set_yscale("log")
            axes.set_ylim(0.05, 20)
            offer = result["offer"]
            axes.set(xlabel="offered at, s", ylabel="wait for first byte or 503, s" if column == 0 else "",
                     title=f"{mode}: {offer['served']} served, {offer['shed_fast']} shed fast,\n"
                           f"{offer['failed_slowly']} failed slowly")
            axes.title.set_fontsize(9)
            axes.grid(alpha=0.3, which="both")
            axes.legend(fontsize=7, markerscale=4, loc="lower right")
            axes = grid[1][column]
            for window, style in (("quiet", ":"), ("during", "-")):
                histogram = result[window]["histogram"]
                buckets = sorted((int(key), count) for key, count in histogram.items())
                total = sum(count for _, count in buckets) or 1
                running, xs, ys = 0, [], []
                for bucket, count in buckets:
                    running += count
                    xs.append(bucket)
                    ys.append(running / total)
                axes.step(xs, ys, where="post", linestyle=style,
                          label=f"{window}: p99 {1000 * (result[window]['p99'] or 0):.0f} ms")
            axes.axvline(100, color="black", linewidth=0.8, linestyle="--")
            axes.set(xlabel="open streams' event delay over the interval, ms",
                     ylabel="share of events" if column == 0 else "")
            axes.set_xlim(-10, 1000)
            axes.grid(alpha=0.3)
            axes.legend(fontsize=7, loc="lower right")
        figure.suptitle(f"Overload: new streams offered at {run[modes[0]]['rate']:.0f}/s next to 1,000 open streams",
                        fontsize=10)
        save(figure, "bench-overload.png")
    return written


def main() -> None:
    source, directory = Path(sys.argv[1]), Path(sys.argv[2])
    for path in write_plots(json.loads(source.read_text()), directory):
        print(path)


if __name__ == "__main__":
    main()
