"""Running `python -m mlpa_aiohttp` commands as real processes, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import aiohttp

from .tiers import require_slow_tier

# The checkout the tests run from (the e2e tests start its config files and modules).
REPO_ROOT = Path(__file__).resolve().parents[2]


# A port handed to a process that binds it later is drawn below the kernel's ephemeral range:
# a port found free inside that range can be taken before the process binds it, by any
# outgoing connection or bind to port 0 (another pytest-xdist worker's, say). Each xdist
# worker draws from its own slice, so two workers never pick the same port.
PORTS_FROM = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _worker_slice(first: int, last: int) -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = (last - first) // max(workers, 1)
    start = first + (index % max(workers, 1)) * width
    return range(start, start + width)


def free_port() -> int:
    """A loopback port no socket is bound to (see PORTS_FROM)."""
    candidates = _worker_slice(PORTS_FROM, _ephemeral_low())
    for port in random.sample(candidates, k=min(len(candidates), 500)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    # An ephemeral range that starts too low to leave room below it: the kernel's choice.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `timeout` seconds; nothing if it
    already exited."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running_demo(env: Mapping[str, str], cwd: str | None = None) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`python -m mlpa_aiohttp demo` on a free port, its stdout and stderr merged into one
    text pipe; yields the process and the port. On exit it is sent SIGTERM and must exit 0."""
    require_slow_tier("starts the demo")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mlpa_aiohttp", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(env),
        cwd=cwd,
    )
    try:
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=10) == 0
        finally:
            process.kill()
            process.stdout.close()


async def assert_demo_streams_a_completion(env: Mapping[str, str], cwd: str | None = None) -> None:
    """Start `python -m mlpa_aiohttp demo` with `env` (from `cwd`), run the curl it prints, stop it."""
    with running_demo(env, cwd) as (process, port):
        ready = process.stdout.readline()
        assert f"http://127.0.0.1:{port}" in ready, ready
        curl = process.stdout.readline()
        token = re.search(r"authorization: Bearer (\S+?)'", curl).group(1)
        body = re.search(r"-d '(.*)'", curl).group(1)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=body,
                headers={"authorization": f"Bearer {token}", "service-type": "ai", "content-type": "application/json"},
            ) as response:
                assert response.status == 200
                text = await response.text()
        events = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        content = "".join(
            (json.loads(e)["choices"][0]["delta"] or {}).get("content") or ""
            for e in events[:-1]
            if json.loads(e).get("choices")
        )
        assert content
