"""How a process that cannot start says so: exit statuses and one message each.

Every entry point (the CLI, gunicorn's master and workers) reports through here, so a
configuration error reads the same everywhere: all problems at once, no traceback, JSON
when `LOG_JSON` asks for it. The statuses are documented in README ("Start-up errors").
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .observability.logging import log_startup_failure
from .settings import TRUTHY, SettingsError

EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: PostgreSQL unreachable at start-up
EXIT_CANNOT_LISTEN = 71  # sysexits EX_OSERR: the port is taken or not ours to bind
EXIT_CONFIG = 78  # sysexits EX_CONFIG: a variable is missing or invalid
# gunicorn's arbiter halts with this status when a worker exits with it before booting.
GUNICORN_WORKER_BOOT_ERROR = 3

CONFIG_HINT = 'every variable is listed in README "Configuration" and config/example.env'


def json_logs_requested(environ: Mapping[str, str]) -> bool:
    """`LOG_JSON` read leniently: the message about an invalid `LOG_JSON` needs a format too."""
    values = {k.upper(): v for k, v in environ.items()}
    return values.get("LOG_JSON", "").strip().lower() in TRUTHY


def report_config_error(
    problems: SettingsError | Sequence[str], environ: Mapping[str, str], *, exit_code: int = EXIT_CONFIG
) -> int:
    listed = problems.problems if isinstance(problems, SettingsError) else tuple(problems)
    log_startup_failure(
        "configuration_error", listed, exit_code=exit_code, hint=CONFIG_HINT, json=json_logs_requested(environ)
    )
    return exit_code


def report_unavailable(
    what: str, error: BaseException | str, environ: Mapping[str, str], *, hint: str, exit_code: int
) -> int:
    log_startup_failure(
        f"{what}_unavailable", [str(error)], exit_code=exit_code, hint=hint, json=json_logs_requested(environ)
    )
    return exit_code
