"""Load-and-fault harness: the service as a real `serve` process, loopback fakes of LiteLLM,
FxA and Sentry served by the calling process, and raw-socket clients that hang up.

Everything is real TCP on 127.0.0.1 (or a network namespace the caller created). The service
writes JSON log lines to a file, which `ServiceProcess.log_events()` reads back; its /metrics
is scraped over HTTP; the fakes are inspected in memory.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from tests.support.fake_sentry import FakeSentry

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAT_PATH = "/v1/chat/completions"

SECRETS = {
    "MASTER_KEY": "sk-load-master",
    "MLPA_VIRTUAL_KEY": "sk-load-virtual",
    "MLPA_UI_ACCESS_KEY": "sk-load-ui",
    "MLPA_ACCESS_TOKEN_SECRET": "load-test-access-token-secret-32-bytes+",
    "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": "load-dev-token",
    # The load runs no iOS or Android client: said explicitly, as production must (D63).
    "APP_ATTEST_ENABLED": "false",
    "PLAY_INTEGRITY_ENABLED": "false",
}


def raise_open_file_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard one (children inherit it); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# ---- the fakes, in this process ---------------------------------------------------------------


@dataclass
class Fakes:
    litellm: FakeLiteLLM
    fxa: FakeFxA
    sentry: FakeSentry
    runners: list[web.AppRunner]
    litellm_url: str
    fxa_url: str
    sentry_dsn: str

    def upstream_connections(self) -> int:
        """TCP connections the service holds open to the fake LiteLLM right now."""
        server = self.runners[0].server
        return len(server.connections) if server is not None else 0

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


async def _serve(app: web.Application, host: str) -> tuple[web.AppRunner, int]:
    # A deep backlog: a burst of 1,000 connects must not wait on SYN retries.
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, backlog=4096)
    await site.start()
    return runner, runner.addresses[0][1]


async def start_fakes(*, host: str = "127.0.0.1", **litellm_knobs: Any) -> Fakes:
    litellm = FakeLiteLLM(
        virtual_key=SECRETS["MLPA_VIRTUAL_KEY"],
        master_key=SECRETS["MASTER_KEY"],
        keep_requests=litellm_knobs.pop("keep_requests", 20_000),
        **litellm_knobs,
    )
    fxa, sentry = FakeFxA(), FakeSentry()
    litellm_runner, litellm_port = await _serve(litellm.make_app(), host)
    fxa_runner, fxa_port = await _serve(fxa.make_app(), host)
    sentry_runner, sentry_port = await _serve(sentry.make_app(), host)
    return Fakes(
        litellm=litellm,
        fxa=fxa,
        sentry=sentry,
        runners=[litellm_runner, fxa_runner, sentry_runner],
        litellm_url=f"http://{host}:{litellm_port}",
        fxa_url=f"http://{host}:{fxa_port}/v1",
        sentry_dsn=FakeSentry.dsn(sentry_port, host=host),
    )


# ---- the service, as a `serve` process ---------------------------------------------------------


@dataclass
class ServiceProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    host: str = "127.0.0.1"
    heap_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    events.append({"event": "unparsable_log_line", "line": line, "level": "error"})
            elif line.strip():
                # Anything not JSON (a raw traceback, an interpreter warning) counts as an error line.
                events.append({"event": "non_json_output", "line": line, "level": "error"})
        return events

    def rss_bytes(self) -> int:
        return proc_rss_bytes(self.pid)

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    async def heap_counts(self, timeout: float = 10.0) -> dict[str, int]:
        """The service's live objects after a collection (`objects`: tracked by the
        collector; `blocks`: the allocator's in use), from a process started with
        `heap_probe=True`."""
        assert self.heap_path is not None, "started without heap_probe"
        self.heap_path.unlink(missing_ok=True)
        self.process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while not self.heap_path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the service did not write its heap counts")
            # A request gives the event loop Python code to run, where the handler runs.
            await self.get("/health/liveness")
            await asyncio.sleep(0.05)
        return json.loads(self.heap_path.read_text())

    async def get(self, path: str) -> bytes:
        """One GET over a fresh connection; the whole answer, head and body, as sent."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n\r\n".encode())
        raw = await reader.read()
        writer.close()
        return raw

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        raw = await self.get("/metrics")
        body = raw.partition(b"\r\n\r\n")[2].decode()
        samples = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    async def availability(self) -> Counter[str]:
        """mlpa_chat_availability_total summed by outcome (success/failure/abort/excluded)."""
        totals: Counter[str] = Counter()
        for (name, labels), value in (await self.metrics()).items():
            if name == "mlpa_chat_availability_total":
                totals[dict(labels)["outcome"]] += int(value)
        return totals

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


def service_environ(fakes: Fakes, port: int, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SENTRY_", "MLPA_", "LITELLM_", "PROMETHEUS_"))
    }
    env.update(SECRETS)
    env.update(
        {
            "PORT": str(port),
            "LITELLM_API_BASE": fakes.litellm_url,
            "FXA_BASE_URL": fakes.fxa_url,
            "SENTRY_DSN": fakes.sentry_dsn,
            "MLPA_STORE": "memory",
            "LOG_JSON": "true",
            "LOG_LEVEL": "info",
            "SHUTDOWN_DRAIN_SECONDS": "1",
        }
    )
    env.update(extra)
    return env


HEAP_PROBE_DIR = Path(__file__).resolve().parent / "heap_probe"


async def start_service(
    fakes: Fakes,
    log_dir: Path,
    *,
    command: list[str] | None = None,
    host: str = "127.0.0.1",
    heap_probe: bool = False,
    **env: str,
) -> ServiceProcess:
    """A `serve` process on a free port, listening. `heap_probe`: it can count its live
    objects (`ServiceProcess.heap_counts`; heap_probe/sitecustomize.py)."""
    raise_open_file_limit()
    port = free_port(host)
    log_path = log_dir / f"service-{port}.log"
    heap_path = log_dir / f"heap-{port}.json" if heap_probe else None
    if heap_path is not None:
        env["MLPA_TEST_HEAP_PROBE"] = str(heap_path)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HEAP_PROBE_DIR), os.environ.get("PYTHONPATH")]))
    argv = command or [sys.executable, "-m", "mlpa_aiohttp", "serve"]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=service_environ(fakes, port, **env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    service = ServiceProcess(process, port, log_path, host, heap_path)
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"service exited with {process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.close()
            break
        except OSError:
            if time.monotonic() > deadline:
                service.stop()
                raise TimeoutError("service did not listen within 30 s") from None
            await asyncio.sleep(0.05)
    return service


def proc_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---- raw-socket clients ------------------------------------------------------------------------


def chat_request(request_id: str, *, host: str, content: str = "Hello", token: str = "demo-token") -> bytes:
    body = json.dumps(
        {"model": "gpt-oss-120b", "stream": True, "messages": [{"role": "user", "content": content}]}
    ).encode()
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        f"Authorization: Bearer {token}\r\n"
        "Service-Type: ai\r\n"
        "Content-Type: application/json\r\n"
        f"X-Request-Id: {request_id}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class ClientResult:
    request_id: str
    hung_up: bool = False
    body_bytes: int = 0
    complete: bool = False
    status: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class HangUp:
    """When a client hangs up: after `after_bytes` body bytes (None: never by size) and/or
    `after_seconds` (None: never by time), or when `until` appears in the body. The time
    counts from the first body byte, or, with `upstream_seen`, from the moment the fake
    upstream has the request (a hang-up before the first byte). `reset` closes with an RST
    (SO_LINGER 0), otherwise with a FIN."""

    after_bytes: int | None = None
    after_seconds: float | None = None
    until: bytes | None = None
    reset: bool = False
    upstream_seen: asyncio.Event | None = None
    # A small receive buffer makes the service's writes back up (a slow link).
    receive_buffer: int | None = None


async def stream_client(
    request_id: str, port: int, hang_up: HangUp | None, *, host: str = "127.0.0.1", content: str = "Hello"
) -> ClientResult:
    """One streaming chat request over a raw socket; reads until the end or hangs up as told."""
    result = ClientResult(request_id)
    try:
        reader, writer = await open_client_connection(
            host, port, receive_buffer=hang_up.receive_buffer if hang_up is not None else None
        )
    except OSError as exc:
        result.error = f"connect: {exc!r}"
        return result
    try:
        writer.write(chat_request(request_id, host=host, content=content))
        started: float | None = None
        if hang_up is not None and hang_up.upstream_seen is not None:
            await hang_up.upstream_seen.wait()
            started = time.monotonic()
        seen = b""
        header_done = False
        while True:
            timeout = None
            if hang_up is not None and hang_up.after_seconds is not None and started is not None:
                timeout = max(0.0, started + hang_up.after_seconds - time.monotonic())
            try:
                chunk = await asyncio.wait_for(reader.read(65536), timeout)
            except asyncio.TimeoutError:
                result.hung_up = True
                break
            if started is None and header_done:
                started = time.monotonic()
            if not chunk:
                result.complete = header_done and seen.endswith(b"0\r\n\r\n")
                break
            if not header_done:
                seen += chunk
                head, sep, rest = seen.partition(b"\r\n\r\n")
                if not sep:
                    continue
                header_done = True
                result.status = int(head.split(b" ", 2)[1])
                seen = rest
                result.body_bytes = len(rest)
                if rest and started is None:
                    started = time.monotonic()
            else:
                result.body_bytes += len(chunk)
                seen = (seen + chunk)[-4096:]
            if seen.endswith(b"0\r\n\r\n"):
                result.complete = True
                break
            if hang_up is not None and (
                (hang_up.after_bytes is not None and result.body_bytes >= hang_up.after_bytes)
                or (hang_up.until is not None and hang_up.until in seen)
            ):
                result.hung_up = True
                break
    except OSError as exc:
        result.error = repr(exc)
    finally:
        if result.hung_up:
            _hang_up(writer, reset=hang_up.reset if hang_up else False)
        else:
            writer.close()
    return result


async def open_client_connection(
    host: str, port: int, *, receive_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if receive_buffer is None:
        return await asyncio.open_connection(host, port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Before connect(), so the window offered in the handshake is the small one.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


def _hang_up(writer: asyncio.StreamWriter, *, reset: bool) -> None:
    sock = writer.get_extra_info("socket")
    if reset and sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


# ---- what the service said ---------------------------------------------------------------------


@dataclass
class Verdict:
    """The service's log, per request id: canonical lines, results, errors."""

    canonical: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, events: list[dict[str, Any]]) -> "Verdict":
        verdict = cls()
        for event in events:
            if str(event.get("level", "")).lower() in ("error", "critical"):
                verdict.errors.append(event)
            if event.get("logger") == "mlpa_aiohttp.request" and event.get("route") == CHAT_PATH:
                verdict.canonical.setdefault(event.get("request_id", "?"), []).append(event)
        return verdict

    def results(self, request_ids: list[str]) -> Counter[str]:
        return Counter(
            self.canonical[rid][0].get("result", "none") if len(self.canonical.get(rid, ())) == 1 else "not_one_line"
            for rid in request_ids
        )

    def not_exactly_one_line(self, request_ids: list[str]) -> list[str]:
        return [rid for rid in request_ids if len(self.canonical.get(rid, ())) != 1]


class UpstreamWatch:
    """Events set when the fake upstream has received a request whose content names an id."""

    def __init__(self, fakes: Fakes) -> None:
        self._fakes = fakes
        self._events: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    def event(self, request_id: str) -> asyncio.Event:
        return self._events.setdefault(request_id, asyncio.Event())

    async def __aenter__(self) -> "UpstreamWatch":
        self._task = asyncio.ensure_future(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        done = 0
        while True:
            records = list(self._fakes.litellm.requests)
            for record in records[done:]:
                if isinstance(record.json, dict):
                    content = str(record.json.get("messages", [{}])[-1].get("content", ""))
                    event = self._events.get(content.rpartition(" ")[2])
                    if event is not None:
                        event.set()
            done = len(records)
            await asyncio.sleep(0.01)


def error_summary(errors: list[dict[str, Any]], limit: int = 3) -> str:
    kinds = Counter(f"{e.get('event')}:{e.get('error_type', '')}" for e in errors)
    sample = [{k: e.get(k) for k in ("event", "error_type", "error", "request_id", "line")} for e in errors[:limit]]
    return f"{dict(kinds)} e.g. {sample}"


def jitter(seed: int) -> random.Random:
    return random.Random(seed)

