"""Running `python -m mlpa_aiohttp` commands as real processes, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

# The checkout the tests run from (the e2e tests start its config files and modules).
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_demo(env: Mapping[str, str], cwd: str | None = None) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`python -m mlpa_aiohttp demo` on a free port, its stdout and stderr merged into one
    text pipe; yields the process and the port. On exit it is sent SIGTERM and must exit 0."""
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
