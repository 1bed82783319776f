"""aiohttp's gunicorn workers, with two fixes for this service (config/gunicorn.conf.py).

* Start-up failures are one message, not a traceback: a configuration error or PostgreSQL
  out of reach while the app starts is reported like the CLI reports it, and the worker
  exits with gunicorn's boot-error status, on which the arbiter stops (exit status 3).
* A clean stop logs no "Error while closing socket [Errno 9] Bad file descriptor": uvloop
  closes a listening socket's descriptor itself, then calls `close()` on the object it was
  handed, expecting EBADF from anything but a real `socket.socket` (which it detaches
  instead). gunicorn's socket wrapper catches that EBADF and logs it. Handing aiohttp the
  wrapped `socket.socket` lets uvloop detach it, and nothing is closed twice.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aiohttp.worker import GunicornUVLoopWebWorker, GunicornWebWorker

from ..fleet.traffic_contracts import ContractsRedisUnreachable
from ..settings import SettingsError
from ..store.base import StoreUnavailable
from .startup import DATABASE_HINT, GUNICORN_WORKER_BOOT_ERROR, REDIS_HINT, report_config_error, report_unavailable


class _ServiceWorker:
    sockets: list[Any]

    def run(self) -> None:
        self.sockets = [getattr(sock, "sock", sock) for sock in self.sockets]
        try:
            super().run()  # type: ignore[misc]
        except SettingsError as error:
            report_config_error(error, os.environ)
            sys.exit(GUNICORN_WORKER_BOOT_ERROR)
        except StoreUnavailable as error:
            report_unavailable("database", error, os.environ, hint=DATABASE_HINT, exit_code=GUNICORN_WORKER_BOOT_ERROR)
            sys.exit(GUNICORN_WORKER_BOOT_ERROR)
        except ContractsRedisUnreachable as error:
            report_unavailable("redis", error, os.environ, hint=REDIS_HINT, exit_code=GUNICORN_WORKER_BOOT_ERROR)
            sys.exit(GUNICORN_WORKER_BOOT_ERROR)


class ServiceWorker(_ServiceWorker, GunicornWebWorker):
    """The asyncio event loop (`GUNICORN_WORKER_CLASS=asyncio`)."""


class ServiceUVLoopWorker(_ServiceWorker, GunicornUVLoopWebWorker):
    """uvloop (the default)."""
