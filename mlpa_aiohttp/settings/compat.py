"""The reference system's variable names, so its configuration keeps working at switch-over.

Renamed variables are read as aliases of their new names (the new name wins when both are
set); every one found, every reference variable this service no longer reads, every
unknown `MLPA_*` / `UPSTREAM_*` / `PG_*` variable and any other name close to a known one
(`LOG_LEVLE`) gets one WARNING at start-up naming what to use instead. `settings/__init__.py`
applies the aliases; the entry points log the warnings once logging is configured, and a
configuration error lists the unknown names in its one message. docs/migration.md has the
same table for people. The variables other code reads (gunicorn's config file, libraries)
are known names too, and documented here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Rename:
    new: str
    reference_default: str
    new_default: str
    note: str = ""


RENAMED: Mapping[str, Rename] = MappingProxyType(
    {
        "LOGURU_LEVEL": Rename("LOG_LEVEL", "INFO", "info"),
        "HTTPX_CONNECT_TIMEOUT_SECONDS": Rename("UPSTREAM_CONNECT_TIMEOUT_SECONDS", "30", "10"),
        "HTTPX_READ_TIMEOUT_SECONDS": Rename(
            "UPSTREAM_READ_TIMEOUT_SECONDS",
            "30",
            "STREAMING_TIMEOUT_SECONDS (300)",
            "non-streaming completions only; streams use STREAMING_TIMEOUT_SECONDS as before",
        ),
        "HTTPX_MAX_CONNECTIONS": Rename(
            "UPSTREAM_MAX_CONNECTIONS",
            "200",
            "20000",
            "every open stream holds one upstream connection, so this caps open streams per process",
        ),
        "HTTPX_KEEPALIVE_EXPIRY_SECONDS": Rename("UPSTREAM_KEEPALIVE_TIMEOUT_SECONDS", "15", "4"),
    }
)

# Reference variables with no counterpart here, and why.
NOT_READ: Mapping[str, str] = MappingProxyType(
    {
        "HTTPX_WRITE_TIMEOUT_SECONDS": "request bodies are small; connect and read timeouts bound the call",
        "HTTPX_POOL_TIMEOUT_SECONDS": "the upstream pool is sized for every open stream (UPSTREAM_MAX_CONNECTIONS)",
        "HTTPX_MAX_KEEPALIVE_CONNECTIONS": "idle connections are kept for UPSTREAM_KEEPALIVE_TIMEOUT_SECONDS",
        "DISCONNECT_POLL_INTERVAL_SECONDS": "client disconnects are event-driven; nothing polls (compatibility.md D1)",
        "HTTPX_LOGGING": "no per-call debug tracing of the HTTP client",
        "ASYNCPG_LOGGING": "no per-query debug tracing (queries carry user ids)",
        "LOG_FILE": "logs go to stdout only (LOG_JSON=true for JSON lines)",
        "LOG_ROTATION": "logs go to stdout only; rotation is the platform's",
        "LOG_COMPRESSION": "logs go to stdout only; rotation is the platform's",
        "APP_ATTEST_QA_CERT_DIR": "mount the QA root certificate and set APP_ATTEST_QA_ROOT_CA_PATH",
        "APP_ATTEST_QA_BUCKET": "nothing is downloaded; set APP_ATTEST_QA_ROOT_CA_PATH to a mounted file",
        "APP_ATTEST_QA_BUCKET_PREFIX": "nothing is downloaded; set APP_ATTEST_QA_ROOT_CA_PATH to a mounted file",
        "APP_ATTEST_QA_GCP_PROJECT_ID": "nothing is downloaded; set APP_ATTEST_QA_ROOT_CA_PATH to a mounted file",
        "PG_DB_URL": "the reference recomputed it; the DB_* variables are what is read",
        # The reference handed both to its FxA client, whose token verification uses neither.
        "CLIENT_ID": "FxA tokens are verified without client credentials, as in the reference",
        "CLIENT_SECRET": "FxA tokens are verified without client credentials, as in the reference; delete it from the Secret",
    }
)

@dataclass(frozen=True, slots=True)
class ReadElsewhere:
    """A variable read by other code than the settings, as the configuration reference shows it."""

    reader: str
    accepts: str
    meaning: str
    # What the default is, for people; "unset" when absent.
    default: str = "unset"
    # The value that spells the default in an env file; None: the variable is left unset.
    value: str | None = None


# Read by other code than the settings: gunicorn's config file (whose own defaults
# tests/unit/test_deploy_config.py holds to these), Google's and Sentry's libraries.
READ_ELSEWHERE: Mapping[str, ReadElsewhere] = MappingProxyType(
    {
        "WEB_CONCURRENCY": ReadElsewhere(
            "config/gunicorn.conf.py",
            "integer ≥ 1",
            "Gunicorn worker processes per pod; scale with pods instead.",
            "`1`",
            "1",
        ),
        "GUNICORN_WORKERS": ReadElsewhere(
            "config/gunicorn.conf.py", "integer ≥ 1", "The same as `WEB_CONCURRENCY`, and wins when both are set."
        ),
        "GUNICORN_WORKER_CLASS": ReadElsewhere(
            "config/gunicorn.conf.py",
            "one of `uvloop`, `asyncio`",
            "The event loop of aiohttp's gunicorn worker.",
            "`uvloop`",
            "uvloop",
        ),
        "SENTRY_ENVIRONMENT": ReadElsewhere("sentry-sdk", "text", "Sentry's environment tag.", "`production`"),
        "GOOGLE_APPLICATION_CREDENTIALS": ReadElsewhere(
            "google-auth",
            "path",
            "Service-account file of Application Default Credentials, which the Play Integrity calls use"
            " unless `PLAY_INTEGRITY_CREDENTIALS_FILE` is set (on GKE, workload identity needs neither).",
        ),
    }
)

# Every unknown name with one of our prefixes is reported (with the closest known name when
# there is one); any other name only when it is this close to a known one (difflib's ratio:
# LOG_LEVLE 0.89, DB_PROT 0.86 are; libpq's PGPORT 0.80, HOST 0.73, PATH 0.50 are not).
CHECKED_PREFIXES = ("MLPA_", "UPSTREAM_", "PG_")
PREFIXED_CUTOFF = 0.6
UNPREFIXED_CUTOFF = 0.85
# The platform's and the interpreter's own, never taken for misspellings of ours.
FOREIGN_PREFIXES = ("KUBERNETES_", "PYTHON", "LC_", "XDG_", "PIP_", "SSH_")
# Kubernetes' service links (a Service named `mlpa` gives MLPA_SERVICE_HOST, MLPA_PORT=tcp://...).
_SERVICE_LINK = re.compile(r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)$")
_SERVICE_LINK_PORT_VALUE = re.compile(r"^(tcp|udp|sctp)://", re.IGNORECASE)


def with_reference_aliases(values: Mapping[str, str]) -> dict[str, str]:
    """Upper-cased environment `values` with each renamed variable copied to its new name
    unless the new name is set itself."""
    resolved = dict(values)
    for old, rename in RENAMED.items():
        if old in values and rename.new not in values:
            resolved[rename.new] = values[old]
    return resolved


@dataclass(frozen=True, slots=True)
class Notice:
    event: str
    fields: Mapping[str, str]


def environment_notices(environ: Mapping[str, str], known: Iterable[str]) -> list[Notice]:
    """One notice per renamed, no-longer-read or unknown variable in `environ`."""
    values = {name.upper(): value for name, value in environ.items()}
    names = set(values)
    known_names = sorted(set(known) | set(READ_ELSEWHERE))
    notices: list[Notice] = []
    for name in sorted(names):
        if name in RENAMED:
            rename = RENAMED[name]
            fields = {"variable": name, "use": rename.new}
            if rename.new in names:
                fields["ignored_because"] = f"{rename.new} is set"
            else:
                fields["read_as"] = rename.new
            if rename.new_default.lower() != rename.reference_default.lower():
                fields["new_default"] = rename.new_default
                fields["reference_default"] = rename.reference_default
            if rename.note:
                fields["note"] = rename.note
            notices.append(Notice("setting_renamed", fields))
        elif name in NOT_READ:
            notices.append(Notice("setting_not_read", {"variable": name, "reason": NOT_READ[name]}))
        elif name not in known_names and not _foreign(name, values[name]):
            notice = _unknown(name, known_names)
            if notice is not None:
                notices.append(notice)
    return notices


def _foreign(name: str, value: str) -> bool:
    """Names the platform sets, which look like ours only by accident (the value is looked
    at only for the service-link `<NAME>_PORT=tcp://...` shape, and never logged)."""
    if _SERVICE_LINK.match(name):
        return True
    if name.endswith("_PORT") and _SERVICE_LINK_PORT_VALUE.match(value.strip()):
        return True
    return name.startswith(FOREIGN_PREFIXES)


def _unknown(name: str, known_names: list[str]) -> Notice | None:
    prefixed = name.startswith(CHECKED_PREFIXES)
    cutoff = PREFIXED_CUTOFF if prefixed else UNPREFIXED_CUTOFF
    closest = difflib.get_close_matches(name, known_names, n=1, cutoff=cutoff)
    if not (prefixed or closest):
        return None
    fields = {"variable": name}
    if closest:
        fields["did_you_mean"] = closest[0]
    return Notice("setting_unknown", fields)


def unknown_variable_notes(environ: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """The unknown variables of `environ` as lines for a start-up error message: a
    misspelled name is often why a variable reads as "not set"."""
    notes = []
    for notice in environment_notices(environ, known):
        if notice.event != "setting_unknown":
            continue
        name, closest = notice.fields["variable"], notice.fields.get("did_you_mean")
        notes.append(f"{name} (did you mean {closest}?)" if closest else name)
    return notes


def warn_about_environment(environ: Mapping[str, str], known: Iterable[str]) -> list[Notice]:
    """Log each notice once at WARNING (names only: values may be secrets)."""
    notices = environment_notices(environ, known)
    for notice in notices:
        log.warning(notice.event, **notice.fields)
    return notices
