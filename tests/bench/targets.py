"""Start the upstreams and the servers under test, each as its own process.

Servers under test ("targets"), all relaying POST /v1/chat/completions to one upstream:

  aiohttp-gunicorn  the service: gunicorn, config/gunicorn.conf.py, aiohttp worker, 1 worker, default config
  aiohttp-serve     the service: `python -m mlpa_aiohttp serve` (web.run_app, one process)
  fastapi-poll      peer: FastAPI + uvicorn + httpx with the original's middlewares and
                    per-chunk inspection (no auth), polls is_disconnected() every 100 ms
  fastapi-receive   peer: the same, awaits receive() until http.disconnect
  fastapi-receive-bare  peer: the receive() relay alone, without the original's stack
  nginx             floor: one worker, proxy_buffering off, keep-alive upstream
  aiohttp-bare      floor of the stack: a bare aiohttp relay, no auth, no accounting
  aiohttp-gunicorn-asyncio (optional) the service under gunicorn's asyncio aiohttp worker
  aiohttp-gunicorn-fast (optional) the service under gunicorn with RELAY_FAST_PATH=true
  aiohttp-gunicorn-production (optional) the service under gunicorn in production's
                    configuration (tests/bench/production.py: PostgreSQL store,
                    PROMETHEUS_MULTIPROC_DIR, JSON lines at INFO)
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .procs import (
    Child,
    Processes,
    free_port,
    tree_cpu_seconds,
    tree_rss_bytes,
    tree_run_delay_seconds,
    tree_runtime_seconds,
    wait_for_port,
)

if TYPE_CHECKING:
    from .production import ProductionConfiguration

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
UPSTREAM_KEY = "sk-test-virtual"
MASTER_KEY = "sk-test-master"
CLIENT_TOKEN = "demo-token"  # the fake FxA's opaque token

SERVICE_TARGETS = ("aiohttp-gunicorn", "aiohttp-serve")
PEER_TARGETS = ("fastapi-poll", "fastapi-receive", "fastapi-receive-bare")
PEER_MODULES = {"fastapi-poll": "poll_peer", "fastapi-receive": "receive_peer", "fastapi-receive-bare": "receive_bare_peer"}
ALL_TARGETS = (*SERVICE_TARGETS, *PEER_TARGETS, "nginx", "aiohttp-bare")
# Not in the default run (time budget): the service under gunicorn's other worker class
# (`aiohttp-gunicorn` uses the config's default, uvloop).
OPTIONAL_TARGETS = ("aiohttp-gunicorn-asyncio", "aiohttp-gunicorn-fast", "aiohttp-gunicorn-production")
# Targets that need a `production` (tests/bench/production.py) to start.
PRODUCTION_TARGETS = ("aiohttp-gunicorn-production",)


@dataclass
class Target:
    name: str
    port: int
    token: str  # what the client sends as its bearer token
    child: Child

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.child.pid)

    def runtime_seconds(self) -> float:
        return tree_runtime_seconds(self.child.pid)

    def run_delay_seconds(self) -> float:
        return tree_run_delay_seconds(self.child.pid)

    def rss_bytes(self) -> int:
        return tree_rss_bytes(self.child.pid)


def python_env(*, root: Path = REPO_ROOT, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("SENTRY_DSN", "PROMETHEUS_MULTIPROC_DIR")}
    # BENCH_SITE_DIR: a directory of bench-only start-up hooks (a sitecustomize), first.
    site_dir = os.environ.get("BENCH_SITE_DIR")
    env["PYTHONPATH"] = f"{site_dir}{os.pathsep}{root}" if site_dir else str(root)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def start_fake_litellm(procs: Processes, *, ttft: float, chunks: int, interval: float, name: str = "fake-litellm") -> int:
    port = free_port()
    child = procs.start(
        name,
        [PYTHON, "-m", "mlpa_aiohttp", "fake-upstream", "--port", str(port),
         "--ttft", str(ttft), "--chunks", str(chunks), "--interval", str(interval)],
        env=python_env(),
    )
    wait_for_port(port, timeout=20, process=child.process)
    return port


def start_paced_upstream(
    procs: Processes, *, ttft: float, chunks: int, interval: float, lost_log: Path | None = None
) -> int:
    return start_paced_upstream_child(procs, ttft=ttft, chunks=chunks, interval=interval, lost_log=lost_log)[0]


def start_paced_upstream_child(
    procs: Processes, *, ttft: float, chunks: int, interval: float, lost_log: Path | None = None,
    held_events: int = 0, held_gap: float = 0.005,
) -> tuple[int, Child]:
    """The paced upstream's port and process (the process to signal, with `held_events`)."""
    port = free_port()
    argv = [PYTHON, "-m", "tests.bench.paced_upstream", "--port", str(port),
            "--ttft", str(ttft), "--chunks", str(chunks), "--interval", str(interval)]
    if lost_log is not None:
        argv += ["--lost-log", str(lost_log)]
    if held_events:
        argv += ["--held-events", str(held_events), "--held-gap", str(held_gap)]
    child = procs.start("paced-upstream", argv, env=python_env())
    wait_for_port(port, timeout=20, process=child.process)
    return port, child


def start_fake_fxa(procs: Processes) -> int:
    port = free_port()
    child = procs.start("fake-fxa", [PYTHON, "-m", "tests.bench.fake_fxa_server", "--port", str(port)], env=python_env())
    wait_for_port(port, timeout=30, process=child.process)
    return port


def environment_assignments(items: Iterable[str]) -> dict[str, str]:
    """`NAME=VALUE` items (a bench's --service-env and the like) as a mapping."""
    found = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise SystemExit(f"{item!r} is not NAME=VALUE")
        found[name] = value
    return found


def add_service_env_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable for every service target (the benches run LOG_LEVEL=warning unless told; "
                             "LOG_LEVEL=info is the default, every request's line written)")


def service_environ(port: int, upstream_port: int, fxa_port: int, root: Path = REPO_ROOT) -> dict[str, str]:
    return python_env(
        root=root,
        MLPA_DEBUG="true",
        MLPA_STORE="memory",
        LITELLM_API_BASE=f"http://127.0.0.1:{upstream_port}",
        MLPA_VIRTUAL_KEY=UPSTREAM_KEY,
        MASTER_KEY=MASTER_KEY,
        FXA_BASE_URL=f"http://127.0.0.1:{fxa_port}/v1",
        LOG_LEVEL="warning",
        PORT=str(port),
        GUNICORN_WORKERS="1",
        # The bench closes its clients before stopping the service; keep shutdown quick.
        SHUTDOWN_DRAIN_SECONDS="1",
    )


def _nginx_config(directory: Path, port: int, upstream_port: int) -> Path:
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    config = directory / "nginx.conf"
    config.write_text(
        f"""
# Generated by tests/bench/targets.py: the floor a relay can reach on this machine.
daemon off;
master_process on;
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
worker_rlimit_nofile 20000;
events {{ worker_connections 19000; }}
http {{
    access_log off;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    upstream litellm {{
        server 127.0.0.1:{upstream_port};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://litellm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # nginx does no auth here: it presents the upstream's key itself.
            proxy_set_header Authorization "Bearer {UPSTREAM_KEY}";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""
    )
    return config


def start_target(
    procs: Processes, name: str, *, upstream_port: int, fxa_port: int, work_dir: Path, baselines: dict[str, Path] | None = None,
    service_env: dict[str, str] | None = None, label: str | None = None,
    production: ProductionConfiguration | None = None,
) -> Target:
    """`name@REF` runs the service target `name` from the source tree exported for REF
    (--baseline-ref), so one run measures before and after a change side by side.
    `service_env` adds variables to a service target's environment (tests/bench/overload.py
    runs the same target with and without a setting); `label` names the target then.
    `production` is what the production target runs on (its database and variables)."""
    port = free_port()
    full_name = name
    name, _, ref = name.partition("@")
    root = (baselines or {})[ref] if ref else REPO_ROOT
    if ref and name not in SERVICE_TARGETS:
        raise ValueError(f"only service targets run from a baseline tree, not {name!r}")
    if name in ("aiohttp-gunicorn", "aiohttp-gunicorn-asyncio", "aiohttp-gunicorn-fast", "aiohttp-gunicorn-production"):
        if name in PRODUCTION_TARGETS:
            if production is None:
                raise ValueError(f"{name} needs a production configuration (tests/bench/production.py)")
            env = production.environ(port, upstream_port, fxa_port, root=root)
        else:
            env = service_environ(port, upstream_port, fxa_port, root)
        if name.endswith("fast"):  # the others run the tree's default configuration
            env["RELAY_FAST_PATH"] = "true"
        env.update(service_env or {})
        # Named explicitly so that a GUNICORN_WORKER_CLASS in the caller's environment
        # cannot change what a target name means.
        env["GUNICORN_WORKER_CLASS"] = "asyncio" if name.endswith("asyncio") else "uvloop"
        child = procs.start(
            full_name,
            [PYTHON, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"],
            env=env,
            cwd=str(root),
        )
        token = CLIENT_TOKEN
    elif name == "aiohttp-serve":
        child = procs.start(full_name, [PYTHON, "-m", "mlpa_aiohttp", "serve"],
                            env=service_environ(port, upstream_port, fxa_port, root), cwd=str(root))
        token = CLIENT_TOKEN
    elif name == "aiohttp-bare":
        child = procs.start(
            name,
            [PYTHON, "-m", "tests.bench.peers.aiohttp_bare", "--port", str(port),
             "--upstream", f"http://127.0.0.1:{upstream_port}"],
            env=python_env(),
        )
        token = CLIENT_TOKEN
    elif name in PEER_TARGETS:
        module = PEER_MODULES[name]
        child = procs.start(
            name,
            # asyncio loop (as the service's worker) and the httptools parser (uvicorn's
            # fast production parser); access log off, as for the service.
            [PYTHON, "-m", "uvicorn", f"tests.bench.peers.{module}:app", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--loop", "asyncio", "--http", "httptools",
             "--log-level", "warning", "--no-access-log", "--backlog", "4096"],
            env=python_env(
                BENCH_UPSTREAM_URL=f"http://127.0.0.1:{upstream_port}/v1/chat/completions",
                BENCH_UPSTREAM_KEY=UPSTREAM_KEY,
            ),
        )
        token = CLIENT_TOKEN
    elif name == "nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        directory = work_dir / f"nginx-{port}"
        config = _nginx_config(directory, port, upstream_port)
        child = procs.start(name, [nginx, "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(config)])
        token = CLIENT_TOKEN
    else:
        raise ValueError(f"unknown target {name!r}; choose from {', '.join(ALL_TARGETS + OPTIONAL_TARGETS)}")
    wait_for_port(port, timeout=60, process=child.process)
    target = Target(label or full_name, port, token, child)
    warm_up(target)
    return target


def warm_up(target: Target, requests: int = 3) -> None:
    """A few requests read to their first body byte: primes the auth cache, the upstream
    pool and lazily imported code, so no measurement pays for first-request work."""
    body = b'{"model":"gpt-oss-120b","stream":true,"messages":[{"role":"user","content":"warm-up"}]}'
    for _ in range(requests):
        deadline = time.monotonic() + 30
        while True:
            connection = http.client.HTTPConnection("127.0.0.1", target.port, timeout=10)
            try:
                connection.request(
                    "POST",
                    "/v1/chat/completions",
                    body=body,
                    headers={"Authorization": f"Bearer {target.token}", "Service-Type": "ai",
                             "Content-Type": "application/json"},
                )
                response = connection.getresponse()
                first = response.read(1)
                if response.status == 200 and first:
                    break
                problem = f"status {response.status}: {first + response.read(500)!r}"
            except OSError as exc:
                problem = repr(exc)
            finally:
                connection.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.name} warm-up failed: {problem}\n{target.child.log_tail()}")
            time.sleep(0.5)
