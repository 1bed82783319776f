"""What MLPA_ADMIN_PORT costs per request (compatibility.md D59): the service under gunicorn
with and without it, the same streams sent to each in alternating rounds, the server's CPU
time per stream (its process tree's, from /proc) printed with the ratio.

    python -m tests.bench.admin_port [--streams 2000] [--rounds 5] [--chunks 20]

With the setting, every request passes one more middleware: a path comparison and the local
port of its connection. Sequential keep-alive streams on one connection, so the figure is
the server's work per stream, not a latency.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import tempfile
from pathlib import Path

from .procs import Processes, free_port, tree_cpu_seconds
from .targets import (
    CLIENT_TOKEN,
    Target,
    start_fake_fxa,
    start_fake_litellm,
    start_target,
)

BODY = b'{"model":"gpt-oss-120b","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def send_streams(target: Target, count: int) -> float:
    """CPU seconds the target spent on `count` streams sent one after another."""
    connection = http.client.HTTPConnection("127.0.0.1", target.port, timeout=30)
    headers = {"authorization": f"Bearer {CLIENT_TOKEN}", "service-type": "ai", "content-type": "application/json"}
    before = tree_cpu_seconds(target.child.pid)
    try:
        for _ in range(count):
            connection.request("POST", "/v1/chat/completions", body=BODY, headers=headers)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200 or not body.endswith(b"data: [DONE]\n\n"):
                raise SystemExit(f"{target.name}: unexpected answer {response.status} {body[-200:]!r}")
    finally:
        connection.close()
    return tree_cpu_seconds(target.child.pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=2000, help="streams per target per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=20, help="chunks of each upstream stream")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-admin-port-") as work, Processes(Path(work)) as procs:
        upstream = start_fake_litellm(procs, ttft=0.0, chunks=args.chunks, interval=0.0)
        fxa = start_fake_fxa(procs)
        targets = {
            "one port": start_target(procs, "aiohttp-gunicorn", upstream_port=upstream, fxa_port=fxa,
                                     work_dir=Path(work), label="one-port"),
            "admin port": start_target(procs, "aiohttp-gunicorn", upstream_port=upstream, fxa_port=fxa,
                                       work_dir=Path(work), label="admin-port",
                                       service_env={"MLPA_ADMIN_PORT": str(free_port())}),
        }
        per_stream: dict[str, list[float]] = {name: [] for name in targets}
        for round_number in range(args.rounds):
            # Alternate the order, so neither always runs on a warmer machine.
            order = list(targets) if round_number % 2 == 0 else list(reversed(targets))
            for name in order:
                per_stream[name].append(send_streams(targets[name], args.streams) / args.streams)
        medians = {name: statistics.median(values) for name, values in per_stream.items()}
        for name, values in per_stream.items():
            spread = (max(values) - min(values)) / medians[name] * 100
            print(f"{name:>10}: {medians[name] * 1e6:8.1f} us CPU per stream (median of {args.rounds}, spread {spread:.1f} %)")
        print(f"admin port / one port: {medians['admin port'] / medians['one port']:.3f}x")


if __name__ == "__main__":
    main()
