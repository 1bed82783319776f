"""Gunicorn settings for mlpa-aiohttp (aiohttp worker).

    gunicorn -c config/gunicorn.conf.py mlpa_aiohttp.app:app_factory

Read from the environment at master start-up (the same variables the app reads, so one
ConfigMap drives both):

    PORT                       listen port (default 8080)
    GUNICORN_WORKERS / WEB_CONCURRENCY   worker processes (default 1: scale by pods)
    GUNICORN_WORKER_CLASS      "uvloop" (default) or "asyncio"
    SHUTDOWN_DRAIN_SECONDS     the app's drain budget for open streams; sets graceful_timeout
    KEEPALIVE_TIMEOUT_SECONDS  idle keep-alive of client connections
    LOG_LEVEL                  level of gunicorn's own loggers
    PROMETHEUS_MULTIPROC_DIR   prometheus multiprocess directory, wiped at start

Start-up errors: an invalid value of any variable (these and the app's own, secrets
included) stops the master before it binds or forks, with one message listing every
problem (JSON with LOG_JSON=true) and exit status 78. PostgreSQL out of reach while a worker
starts the app: one message, the worker exits 3 and gunicorn's arbiter stops with 3
("Worker failed to boot"). Every line gunicorn writes goes through the app's formatter.

Shutdown budget, outermost first (kept in order by tests/unit/test_deploy_config.py):
    terminationGracePeriodSeconds (Kubernetes) > preStop pause + graceful_timeout
    graceful_timeout * 0.95 (aiohttp worker's shutdown_timeout) > drain + SHUTDOWN_MARGIN_SECONDS
"""

from __future__ import annotations

import math
import os
import shutil

from mlpa_aiohttp.settings import ServerSettings, Settings, SettingsError
from mlpa_aiohttp.startup import EXIT_CONFIG, json_logs_requested, report_config_error

# aiohttp's workers with clean start-up errors and a clean socket close (gunicorn_worker.py).
WORKER_CLASSES = {
    "asyncio": "mlpa_aiohttp.gunicorn_worker.ServiceWorker",
    "uvloop": "mlpa_aiohttp.gunicorn_worker.ServiceUVLoopWorker",
}

# Invalid values of the variables read here; reported with the app's own in on_starting,
# so one start shows every problem. Each falls back to its default meanwhile.
problems: list[str] = []

# The aiohttp worker passes graceful_timeout / 100 * 95 to AppRunner as shutdown_timeout.
AIOHTTP_SHUTDOWN_SHARE = 0.95

# Time around the drain itself: the worker notices SIGTERM at its next 1 s heartbeat, then
# final stream frames, closing the database pools and the upstream session, and the Sentry
# SDK's flush at exit (2 s at most).
SHUTDOWN_MARGIN_SECONDS = 5.0


def _env_text(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def _env_number(name: str, default: float, *, minimum: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        problems.append(f"{name}: expected a number, got {text!r}")
        return default
    if not math.isfinite(value) or value < minimum:
        problems.append(f"{name}: must be a finite number of at least {minimum}, got {text!r}")
        return default
    return value


def _worker_count() -> int:
    for name in ("GUNICORN_WORKERS", "WEB_CONCURRENCY"):
        if os.environ.get(name, "").strip():
            count = _env_number(name, 1, minimum=1)
            if count != int(count):
                problems.append(f"{name}: expected a whole number, got {count}")
                return 1
            return int(count)
    return 1


def _worker_class() -> str:
    # uvloop: ~5 % less CPU per relayed chunk and ~13 % less with 5,000 open streams than
    # asyncio's loop, measured side by side (docs/performance.md, "The worker class").
    choice = _env_text("GUNICORN_WORKER_CLASS", "uvloop").lower()
    if choice not in WORKER_CLASSES:
        problems.append(f"GUNICORN_WORKER_CLASS: expected one of {', '.join(WORKER_CLASSES)}, got {choice!r}")
        return WORKER_CLASSES["uvloop"]
    return WORKER_CLASSES[choice]


def graceful_timeout_for(drain_seconds: float) -> int:
    """The smallest whole graceful_timeout whose 95 % share exceeds drain + margin."""
    return math.floor((drain_seconds + SHUTDOWN_MARGIN_SECONDS) / AIOHTTP_SHUTDOWN_SHARE) + 1


_DEFAULTS = ServerSettings()
drain_seconds = _env_number("SHUTDOWN_DRAIN_SECONDS", _DEFAULTS.shutdown_drain_seconds, minimum=0)

bind = [f"0.0.0.0:{int(_env_number('PORT', _DEFAULTS.port, minimum=1))}"]
workers = _worker_count()
worker_class = _worker_class()

# Idle keep-alive of client connections; the app's own KEEPALIVE_TIMEOUT_SECONDS, so both agree.
# It must outlast the idle timeout of the proxy in front, so the proxy (not this server)
# closes idle connections; otherwise a request racing our close gets a 502. The default 75 s
# covers 60 s proxies (AWS ALB, nginx); Google Cloud load balancers keep backend connections
# for 600 s, so the Kubernetes ConfigMap raises it to 620 s.
# (Gunicorn wants whole seconds; rounding up keeps it above the proxy's timeout.)
keepalive = math.ceil(_env_number("KEEPALIVE_TIMEOUT_SECONDS", _DEFAULTS.keepalive_timeout_seconds, minimum=0))

graceful_timeout = graceful_timeout_for(drain_seconds)

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

# LOGURU_LEVEL: the reference's name, read as an alias like the app does (settings_compat).
loglevel = _env_text("LOG_LEVEL", _env_text("LOGURU_LEVEL", _DEFAULTS.log_level)).lower()
if loglevel not in ("debug", "info", "warning", "error", "critical"):
    loglevel = _DEFAULTS.log_level.lower()  # the app's settings report the bad value
# The master's lines in the app's format (JSON with LOG_JSON=true); workers then set up
# the same formatter themselves (app_factory -> configure_logging).
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "service": {
            "()": "mlpa_aiohttp.observability.logging.stdlib_formatter",
            "json": json_logs_requested(os.environ),
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


def _prometheus_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip() or None


def check_configuration() -> list[str]:
    """Every problem with the environment: this file's variables and the app's settings."""
    found = list(problems)
    try:
        Settings.from_environ(os.environ)
    except SettingsError as error:
        named = {problem.split(":", 1)[0] for problem in found}
        found += [problem for problem in error.problems if problem.split(":", 1)[0] not in named]
    return found


def on_starting(server) -> None:
    """Refuse to start on a configuration error, before binding or forking a worker (a
    worker that failed on it would be one traceback per worker). Then start each
    deployment with an empty prometheus multiprocess directory: files left by an earlier
    run would be summed into /metrics. The directory itself may be a mount point (an
    emptyDir), so its contents are removed, not the directory.
    """
    found = check_configuration()
    if found:
        if server.pidfile is not None:
            server.pidfile.unlink()
        raise SystemExit(report_config_error(found, os.environ, exit_code=EXIT_CONFIG))
    directory = _prometheus_dir()
    if directory is None:
        return
    os.makedirs(directory, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    server.log.info("Prometheus multiprocess directory %s emptied", directory)


def when_ready(server) -> None:
    """Dead-peer detection (mlpa_aiohttp/client_sockets.py) on the listeners: workers'
    accepted client connections inherit keepalive and TCP_USER_TIMEOUT from them."""
    from mlpa_aiohttp import client_sockets
    from mlpa_aiohttp.settings import Settings

    options = Settings.from_environ(os.environ, check_secrets=False).server.dead_peer_options()
    applied = [client_sockets.apply(listener.sock, options) for listener in server.LISTENERS]
    if any(applied):
        server.log.info("Client dead-peer detection on: vanished clients noticed within %.0f s", options.bound_seconds())


def post_worker_init(worker) -> None:
    """Say when a worker has its signal handlers: a SIGTERM that arrives while a worker is
    still booting is lost to gunicorn's boot window (the worker then lives until the
    graceful timeout), so tests and operators can tell booting from ready."""
    worker.log.info("Worker ready (pid: %s)", worker.pid)


def child_exit(server, worker) -> None:
    """Drop a dead worker's live gauges from /metrics (its counters are kept)."""
    directory = _prometheus_dir()
    if directory is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, directory)
