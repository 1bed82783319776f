"""LISTEN_BACKLOG reaches the listening socket under `serve` and under gunicorn (the kernel
reports a listener's accept-queue limit as ss's Send-Q) once the server answers; run_app's
own default is 128, and aiohttp's gunicorn worker re-listens its sockets with 128 when its
sites start."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ..conftest import TEST_SECRETS

pytestmark = [
    pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2), installed by .ci/run"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKLOG = 1234  # below net.core.somaxconn (4096 by default), so the kernel keeps it as is


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listen_backlog(port: int) -> int | None:
    lines = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    for line in lines.splitlines():
        fields = line.split()  # State Recv-Q Send-Q Local:Port Peer:Port
        if len(fields) >= 4 and fields[3].endswith(f":{port}"):
            return int(fields[2])
    return None


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveness", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("entry", ["serve", "gunicorn"])
def test_listen_backlog_is_applied(entry: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **os.environ,
        **TEST_SECRETS,
        "MLPA_STORE": "memory",
        "PORT": str(port),
        "LISTEN_BACKLOG": str(BACKLOG),
        "LITELLM_API_BASE": "http://127.0.0.1:9",  # never called: nothing is requested
        "LOG_LEVEL": "warning",
        "GUNICORN_WORKERS": "1",
        "SHUTDOWN_DRAIN_SECONDS": "0",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    argv = (
        [sys.executable, "-m", "mlpa_aiohttp", "serve"]
        if entry == "serve"
        else [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"]
    )
    log = tmp_path / "server.log"
    with log.open("wb") as output:
        process = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            assert process.poll() is None, f"{entry} exited early:\n{log.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"{entry} never answered:\n{log.read_text(errors='replace')}"
            time.sleep(0.1)
        assert _listen_backlog(port) == BACKLOG
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
