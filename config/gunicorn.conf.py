"""Gunicorn settings for mlpa-aiohttp (aiohttp worker).

    gunicorn -c config/gunicorn.conf.py mlpa_aiohttp.app:app_factory

Read from the environment at master start-up. The app's own variables are read by the
app's `Settings` (same rules, same defaults), so one ConfigMap drives both:

    PORT                       listen port
    MLPA_ADMIN_PORT            second listen port, for /metrics and the admin routes (unset: none)
    SHUTDOWN_DRAIN_SECONDS     the app's drain budget for open streams; sets graceful_timeout
    KEEPALIVE_TIMEOUT_SECONDS  idle keep-alive of client connections
    LISTEN_BACKLOG             accept queue of the listening socket (capped by net.core.somaxconn)
    LOG_LEVEL, LOG_JSON        level and format of gunicorn's own lines
    PROMETHEUS_MULTIPROC_DIR   prometheus multiprocess directory, wiped at start
    CLIENT_KEEPALIVE_*, CLIENT_USER_TIMEOUT_SECONDS   dead-peer detection on the listeners

and gunicorn's own, read only here:

    GUNICORN_WORKERS / WEB_CONCURRENCY   worker processes (default 1: scale by pods)
    GUNICORN_WORKER_CLASS      "uvloop" (default) or "asyncio"

Start-up errors: an invalid value of any variable (these and the app's own, secrets
included) stops the master before it binds or forks, with one message listing every
problem (JSON with LOG_JSON=true) and exit status 78. PostgreSQL out of reach while a worker
starts the app: one message, the worker exits 3 and gunicorn's arbiter stops with 3
("Worker failed to boot"); a worker says "Worker ready" only once its app has started.
The port in use or not ours to bind: one message naming the address, exit status 71.

The catalogue file (MLPA_CATALOG_FILE) is checked by the master, at start and on each HUP;
workers read the master's copy of the last file that passed, so a broken file on HUP is one
ERROR, and the new workers serve the previous catalogue (mlpa_aiohttp/process/catalog_snapshot.py).
Every line gunicorn writes goes through the app's formatter.

Shutdown budget, outermost first (kept in order by tests/unit/test_deploy_config.py):
    terminationGracePeriodSeconds (Kubernetes) > preStop pause + graceful_timeout
    graceful_timeout * 0.95 (aiohttp worker's shutdown_timeout) > drain + SHUTDOWN_MARGIN_SECONDS
"""

from __future__ import annotations

import math
import os
import shutil
import socket

from mlpa_aiohttp.process.catalog_snapshot import report_catalog_kept, snapshot_for_environ
from mlpa_aiohttp.settings import Settings
from mlpa_aiohttp.process.startup import (
    EXIT_CANNOT_LISTEN,
    EXIT_CONFIG,
    listen_problem,
    report_config_error,
    report_unavailable,
)

# aiohttp's workers with clean start-up errors and a clean socket close (process/gunicorn_worker.py).
WORKER_CLASSES = {
    "asyncio": "mlpa_aiohttp.process.gunicorn_worker.ServiceWorker",
    "uvloop": "mlpa_aiohttp.process.gunicorn_worker.ServiceUVLoopWorker",
}

# The app's settings without the secret checks (on_starting adds them): the values below
# come from them. An invalid value falls back to its default meanwhile and is listed here,
# with gunicorn's own, to be reported in on_starting, so one start shows every problem.
_reading = Settings.read_environ(os.environ, check_secrets=False)
_server = _reading.settings.server
problems: list[str] = list(_reading.problems)

# The aiohttp worker passes graceful_timeout / 100 * 95 to AppRunner as shutdown_timeout.
AIOHTTP_SHUTDOWN_SHARE = 0.95

# Time around the drain itself: the worker notices SIGTERM at its next 1 s heartbeat, then
# final stream frames, closing the database pools and the upstream session, and the Sentry
# SDK's flush at exit (2 s at most).
SHUTDOWN_MARGIN_SECONDS = 5.0


def _env_text(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def _env_whole_number(name: str) -> int:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text)
    except ValueError:
        problems.append(f"{name}: expected a number, got {text!r}")
        return 1
    if not math.isfinite(value) or value < 1:
        problems.append(f"{name}: must be a finite number of at least 1, got {text!r}")
        return 1
    if value != int(value):
        problems.append(f"{name}: expected a whole number, got {value}")
        return 1
    return int(value)


def _worker_count() -> int:
    for name in ("GUNICORN_WORKERS", "WEB_CONCURRENCY"):
        if os.environ.get(name, "").strip():
            return _env_whole_number(name)
    return 1


def _worker_class() -> str:
    # uvloop: ~5 % less CPU per relayed chunk and ~13 % less with 5,000 open streams than
    # asyncio's loop, measured side by side (docs/performance.md, "How it is measured").
    choice = _env_text("GUNICORN_WORKER_CLASS", "uvloop").lower()
    if choice not in WORKER_CLASSES:
        problems.append(f"GUNICORN_WORKER_CLASS: expected one of {', '.join(WORKER_CLASSES)}, got {choice!r}")
        return WORKER_CLASSES["uvloop"]
    return WORKER_CLASSES[choice]


def graceful_timeout_for(drain_seconds: float) -> int:
    """The smallest whole graceful_timeout whose 95 % share exceeds drain + margin."""
    return math.floor((drain_seconds + SHUTDOWN_MARGIN_SECONDS) / AIOHTTP_SHUTDOWN_SHARE) + 1


bind = [f"0.0.0.0:{_server.port}"]
# The operators' routes on a second listener (mlpa_aiohttp/routes/admin_port.py): the same app
# listens on both and keeps each to its routes.
if _server.admin_port is not None:
    bind.append(f"0.0.0.0:{_server.admin_port}")
workers = _worker_count()
worker_class = _worker_class()

# Idle keep-alive of client connections; the app's own KEEPALIVE_TIMEOUT_SECONDS, so both agree.
# It must outlast the idle timeout of the proxy in front, so the proxy (not this server)
# closes idle connections; otherwise a request racing our close gets a 502. The default 75 s
# covers 60 s proxies (AWS ALB, nginx); Google Cloud load balancers keep backend connections
# for 600 s, so the Kubernetes ConfigMap raises it to 620 s.
# (Gunicorn wants whole seconds; rounding up keeps it above the proxy's timeout.)
keepalive = math.ceil(_server.keepalive_timeout_seconds)

graceful_timeout = graceful_timeout_for(_server.shutdown_drain_seconds)

# The accept queue, the app's own LISTEN_BACKLOG (what `serve` uses), so both agree. Gunicorn's
# default is 2048; 4096 takes a burst of new streams (5,000 in 3 s, measured in
# docs/performance.md) without overflowing. The kernel caps it at net.core.somaxconn.
backlog = _server.listen_backlog

# The aiohttp worker heartbeats once a second from its event loop, so this catches a blocked
# loop. It must also cover start-up (pools, budgets) and a worker draining after a reload,
# which stops heartbeating while it drains.
timeout = max(60, graceful_timeout + 5)

# The heartbeat file lives in memory, not on a possibly slow or read-only disk.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None

# Gunicorn 25.1+ opens a control socket under $HOME; the image has no writable home (read-only
# root filesystem) and Kubernetes does the restarts and scaling. Older versions ignore this.
control_socket_disable = True

# The app writes its own canonical request line (and one for cancelled requests, which
# aiohttp never access-logs).
accesslog = None

loglevel = _server.log_level.lower()
# The master's lines in the app's format (JSON with LOG_JSON=true); workers then set up
# the same formatter themselves (app_factory -> configure_logging).
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "service": {
            "()": "mlpa_aiohttp.observability.logging.stdlib_formatter",
            "json": _server.log_json,
        },
    },
    "handlers": {
        "stdout": {"class": "logging.StreamHandler", "formatter": "service", "stream": "ext://sys.stdout"},
    },
    "root": {"level": loglevel.upper(), "handlers": ["stdout"]},
    "loggers": {
        # Propagate to the root handler only, so the app's logging setup in the worker
        # (structlog) formats these lines too.
        "gunicorn.error": {"level": loglevel.upper(), "handlers": [], "propagate": True},
        "gunicorn.access": {"level": "WARNING", "handlers": [], "propagate": True},
    },
}


def check_configuration() -> list[str]:
    """Every problem with the environment: gunicorn's variables and the app's settings,
    secrets included."""
    secrets_checked = Settings.read_environ(os.environ).problems
    return problems + [problem for problem in secrets_checked if problem not in problems]


def on_starting(server) -> None:
    """Refuse to start on a configuration error, before binding or forking a worker (a
    worker that failed on it would be one traceback per worker), the catalogue file
    included, whose checked copy the workers read (`on_reload`). Then start each
    deployment with an empty prometheus multiprocess directory: files left by an earlier
    run would be summed into /metrics. The directory itself may be a mount point (an
    emptyDir), so its contents are removed, not the directory.
    """
    found = check_configuration()
    snapshot = None
    if not found:
        snapshot, found = snapshot_for_environ(os.environ)
    if found:
        if server.pidfile is not None:
            server.pidfile.unlink()
        raise SystemExit(report_config_error(found, os.environ, exit_code=EXIT_CONFIG))
    _refuse_a_taken_address(server)
    # Kept on the arbiter: it outlives this module, which gunicorn re-executes on each HUP.
    server.mlpa_catalog_snapshot = snapshot
    directory = _reading.settings.observability.prometheus_multiproc_dir
    if directory is None:
        return
    os.makedirs(directory, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    server.log.info("Prometheus multiprocess directory %s emptied", directory)


def _refuse_a_taken_address(server) -> None:
    """A port in use (or not ours to bind) stops the master at once with one message and
    exit status 71, as `serve` does; gunicorn itself would retry five times and exit 1.
    Each address is bound once the way gunicorn binds it (SO_REUSEADDR), then released.
    Skipped when the listeners are inherited (systemd, a USR2 re-exec: the old master
    holds the port) or each worker binds its own (reuse_port)."""
    if server.LISTENERS or server.cfg.reuse_port or os.environ.get("GUNICORN_FD") or os.environ.get("LISTEN_FDS"):
        return
    for address in server.cfg.address:
        if not isinstance(address, tuple):  # a Unix socket path or a file descriptor
            continue
        host, port = address[0], address[1]
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                choose_port = "MLPA_ADMIN_PORT" if port == _server.admin_port else "PORT"
                found = listen_problem(error, host, port, choose_port=choose_port, choose_host="gunicorn's --bind")
                if found is None:
                    continue  # gunicorn's own bind reports it
                if server.pidfile is not None:
                    server.pidfile.unlink()
                problem, hint = found
                raise SystemExit(
                    report_unavailable("port", problem, os.environ, hint=hint, exit_code=EXIT_CANNOT_LISTEN)
                ) from None


def on_reload(server) -> None:
    """On HUP, before the new workers are forked: take the operator's catalogue file if it
    passes the start-up check, else keep the last good one (mlpa_aiohttp/process/catalog_snapshot.py)."""
    snapshot = getattr(server, "mlpa_catalog_snapshot", None)
    if snapshot is None:
        return
    found = snapshot.take(os.environ)
    if found:
        report_catalog_kept(found, os.environ)
    else:
        server.log.info("Catalogue file %s checked: new workers serve it", snapshot.source)


def post_fork(server, worker) -> None:
    """A new worker reads the master's last good copy of the catalogue file."""
    snapshot = getattr(server, "mlpa_catalog_snapshot", None)
    if snapshot is not None:
        snapshot.point_at_snapshot(os.environ)


def when_ready(server) -> None:
    """Dead-peer detection (mlpa_aiohttp/process/client_sockets.py) on the listeners: workers'
    accepted client connections inherit keepalive and TCP_USER_TIMEOUT from them."""
    from mlpa_aiohttp.process import client_sockets

    options = Settings.from_environ(os.environ, check_secrets=False).server.dead_peer_options()
    applied = [client_sockets.apply(listener.sock, options) for listener in server.LISTENERS]
    if any(applied):
        server.log.info("Client dead-peer detection on: vanished clients noticed within %.0f s", options.bound_seconds())


def post_worker_init(worker) -> None:
    _once_serving(worker)


def _once_serving(worker) -> None:
    """Two things to do once the worker's app has started and its sites listen, before it
    handles a request. The aiohttp worker calls notify() (its heartbeat) first right after
    its sites started; post_worker_init runs earlier, before the app's start-up (pools,
    budgets), which may still fail.

    * Say the worker is ready: "Worker ready" means the app started (a worker whose
      database is down never says it) and the worker has its signal handlers (a SIGTERM
      that arrives while a worker is still booting is lost to gunicorn's boot window), so
      tests and operators can tell booting from ready.
    * aiohttp's worker starts each site as `SockSite(runner, sock)`, whose default backlog
      (128) listen()s the inherited socket again and silently replaces gunicorn's
      `backlog`: a burst of new streams then overflows the accept queue
      (docs/performance.md, "The burst and the listen backlog"). listen() once more with the
      configured backlog.
    """
    heartbeat = worker.notify
    serving = False

    def notify() -> None:
        nonlocal serving
        if not serving and worker.booted:
            serving = True
            for listener in worker.sockets:
                # The service's workers hold the plain socket; gunicorn's wrapper has `.sock`.
                getattr(listener, "sock", listener).listen(worker.cfg.backlog)
            worker.log.info("Worker ready (pid: %s)", worker.pid)
        heartbeat()

    worker.notify = notify


def child_exit(server, worker) -> None:
    """Drop a dead worker's live gauges from /metrics (its counters are kept)."""
    directory = _reading.settings.observability.prometheus_multiproc_dir
    if directory is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, directory)
