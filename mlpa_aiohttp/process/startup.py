"""How a process that cannot start says so: exit statuses and one message each.

Every entry point (the CLI, gunicorn's master and workers) reports through here, so a
configuration error reads the same everywhere: all problems at once, no traceback, JSON
when `LOG_JSON` asks for it. The statuses are documented in docs/operations.md ("Start-up errors").
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

from ..observability.logging import log_startup_failure
from ..settings import TRUTHY, SettingsError, variable_names
from ..settings.compat import unknown_variable_notes

EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: PostgreSQL unreachable at start-up
EXIT_CANNOT_LISTEN = 71  # sysexits EX_OSERR: the port is taken or not ours to bind
EXIT_CONFIG = 78  # sysexits EX_CONFIG: a variable is missing or invalid
# gunicorn's arbiter halts with this status when a worker exits with it before booting.
GUNICORN_WORKER_BOOT_ERROR = 3

CONFIG_HINT = "every variable is listed in docs/configuration.md and config/example.env"
# PostgreSQL out of reach, or the app database missing, when the app starts (serve, gunicorn).
DATABASE_HINT = (
    "start PostgreSQL or correct DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD, LITELLM_DB_NAME, APP_ATTEST_DB_NAME"
    " (and DB_SSL_MODE, DB_SSL_ROOT_CERT for TLS); "
    "`python -m mlpa_aiohttp migrate` creates the app database and its tables"
)
# Redis out of reach at start while traffic contracts are enabled (the reference's rule).
REDIS_HINT = (
    "start Redis or correct REDIS_HOST, REDIS_PORT, REDIS_PASSWORD; traffic contracts need it at start"
    " (ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT=false turns them off)"
)
CATALOG_FILE_HINT = "; docs/catalog.md describes the catalogue file (`python -m mlpa_aiohttp catalog check FILE`)"


def json_logs_requested(environ: Mapping[str, str]) -> bool:
    """`LOG_JSON` read leniently: the message about an invalid `LOG_JSON` needs a format too."""
    values = {k.upper(): v for k, v in environ.items()}
    return values.get("LOG_JSON", "").strip().lower() in TRUTHY


def report_config_error(
    problems: SettingsError | Sequence[str], environ: Mapping[str, str], *, exit_code: int = EXIT_CONFIG
) -> int:
    listed = problems.problems if isinstance(problems, SettingsError) else tuple(problems)
    hint = CONFIG_HINT
    if any(problem.startswith("MLPA_CATALOG_FILE") for problem in listed):
        hint += CATALOG_FILE_HINT
    log_startup_failure(
        "configuration_error",
        listed,
        exit_code=exit_code,
        hint=hint,
        json=json_logs_requested(environ),
        unknown_variables=unknown_variable_notes(environ, variable_names()),
    )
    return exit_code


def report_unavailable(
    what: str, error: BaseException | str, environ: Mapping[str, str], *, hint: str, exit_code: int
) -> int:
    log_startup_failure(
        f"{what}_unavailable", [str(error)], exit_code=exit_code, hint=hint, json=json_logs_requested(environ)
    )
    return exit_code


def listen_problem(
    error: OSError, host: str, port: int, *, choose_port: str, choose_host: str
) -> tuple[str, str] | None:
    """What a failed bind means and what to do, or None for an error that is not about the
    address; `choose_port` / `choose_host` name how to pick another (`--port`, `PORT`...)."""
    if error.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use",
            f"stop the process holding it (ss -ltnp 'sport = :{port}' shows it) or choose another with {choose_port}",
        )
    if error.errno == errno.EACCES:
        return f"no permission to listen on {host}:{port}", f"choose a port above 1023 with {choose_port}"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine", f"choose another with {choose_host} (127.0.0.1 or 0.0.0.0)"
    return None
