"""Configuration: one frozen dataclass per section, read once from an environ mapping.

Each field names its environment variable, holds the one default and says what the variable
means (`variable`, `secret`, `derived`); the reader walks the fields, so a new setting is one
field, and the configuration reference (docs/configuration.md, config/example.env) is made from
them by settings/reference.py. The demo and MLPA_DEBUG change a few defaults: `DEMO_DEFAULTS`
and `DEBUG_DEFAULTS` say which.

`Settings.from_environ(os.environ)` is called by the entry points only (gunicorn's config
file uses `read_environ`, which returns the problems instead); tests build settings from a
plain dict. Invalid values fail at startup with one `SettingsError` that
lists every problem found (each naming its variable), so one restart shows them all.
Secrets are `repr=False`, so a logged settings object never shows them.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, is_dataclass
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar, get_type_hints, overload

from ..catalog import BUILTIN_CATALOG, BudgetTier, Catalog, ServiceType
from ..catalog.file import CatalogError, load_catalog
from .compat import with_reference_aliases

FXA_PRODUCTION_URL = "https://oauth.accounts.firefox.com/v1"
FXA_STAGE_URL = "https://api-accounts.stage.mozaws.net/v1"

T = TypeVar("T")


class SettingsError(ValueError):
    """Configuration values are missing or invalid; `problems` has one line per variable."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: tuple[str, ...] = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))


# The values that switch an option on, in variables and in opt-in headers alike.
TRUTHY = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class _Env:
    """Typed, case-insensitive reads from an environ mapping; errors name the variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        # The reference's renamed variables are read as their new names (settings/compat.py).
        self._values = with_reference_aliases({k.upper(): v for k, v in environ.items()})
        self.names_read: set[str] = set()
        # Every invalid value is recorded and replaced by its default, so that reading
        # goes on and one error can list them all.
        self.problems: list[str] = []
        # The effective catalogue once `Settings.catalog` is read: the capped-type reader
        # of the signup-cap section, read after it, takes its set from there.
        self.catalog: Catalog = BUILTIN_CATALOG

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def raw(self, name: str) -> str | None:
        self.names_read.add(name)
        return self._values.get(name)

    def str(self, name: str, default: str) -> str:
        value = self.raw(name)
        return default if value is None else value.strip()

    def optional_str(self, name: builtins.str) -> builtins.str | None:
        value = (self.raw(name) or "").strip()
        return value or None

    def _parse(self, name: builtins.str, default: T, kind: builtins.str, parse: Callable[[builtins.str], T]) -> T:
        value = self.raw(name)
        if value is None or value.strip() == "":
            return default
        try:
            return parse(value.strip())
        except (ValueError, TypeError):
            self.problem(f"{name}: expected {kind}, got {value!r}")
            return default

    def bool(self, name: builtins.str, default: bool) -> bool:
        def parse(value: builtins.str) -> bool:
            lowered = value.lower()
            if lowered in TRUTHY:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError(value)

        return self._parse(name, default, "a boolean (true/false/1/0/yes/no/on/off)", parse)

    def int(self, name: builtins.str, default: int, *, minimum: float | None = None) -> int:
        value = self._parse(name, default, "an integer", int)
        if minimum is not None and value < minimum:
            self.problem(f"{name}: must be at least {minimum}, got {value}")
            return default
        return value

    @overload
    def float(
        self, name: builtins.str, default: builtins.float, *, minimum: builtins.float | None = None
    ) -> builtins.float: ...
    @overload
    def float(
        self, name: builtins.str, default: None, *, minimum: builtins.float | None = None
    ) -> builtins.float | None: ...
    def float(
        self, name: builtins.str, default: builtins.float | None, *, minimum: builtins.float | None = None
    ) -> builtins.float | None:
        """A finite number; None only when the variable is unset and the default is None."""
        value = self._parse(name, default, "a number", float)
        if value is None:
            return None
        if not math.isfinite(value):
            self.problem(f"{name}: must be a finite number, got {value}")
            return default
        if minimum is not None and value < minimum:
            self.problem(f"{name}: must be at least {minimum}, got {value}")
            return default
        return value

    def str_set(self, name: builtins.str, default: frozenset[builtins.str] | None) -> frozenset[builtins.str] | None:
        """A JSON list (the reference's format) or a comma-separated list."""

        def parse(value: builtins.str) -> frozenset[builtins.str]:
            if value.startswith("["):
                items = json.loads(value)
                if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                    raise ValueError(value)
            else:
                items = value.split(",")
            return frozenset(i.strip() for i in items if i.strip())

        return self._parse(name, default, "a JSON list of strings or a comma-separated list", parse)

    def choice(self, name: builtins.str, default: builtins.str, choices: tuple[builtins.str, ...]) -> builtins.str:
        """One of `choices`, matched case-insensitively and returned as spelled there."""
        wanted = self.str(name, default).lower()
        for choice in choices:
            if choice.lower() == wanted:
                return choice
        self.problem(f"{name}: expected one of {', '.join(c.lower() for c in choices)}, got {wanted!r}")
        return default


# --- how a field is read and documented -----------------------------------------------------

_VARIABLE = "mlpa_aiohttp.settings.variable"


@dataclass(frozen=True, slots=True)
class Documented:
    """A variable a `derived` field's reader reads, as the configuration reference shows it
    (a plain field's variable is shown from the field itself: name, default, kind)."""

    name: str
    accepts: str
    meaning: str
    # What the default is, for people; "unset" when absent.
    default: str = "unset"
    # The value that spells the default in an env file; None: the variable is left unset.
    value: str | None = None
    # A `<TYPE>` in `name` stands for each service type of the catalogue, whose budget tier's
    # field of this name is the default.
    tier_field: str | None = None


@dataclass(frozen=True, slots=True)
class Variable:
    """How one field is read from the environment, and what it means; kept in the field's
    metadata. The field's default is the only default: the reader falls back to it (or to the
    demo's or debug's, see `DEMO_DEFAULTS`) when the variable is unset or invalid."""

    # None when `read` reads several variables itself.
    name: str | None
    # Short reference prose: what the variable does, for docs/configuration.md and example.env.
    meaning: str = ""
    minimum: float | None = None
    # A string setting restricted to these values (matched case-insensitively).
    choices: tuple[str, ...] = ()
    # The default is the value read for this earlier field of the same section.
    follows: str | None = None
    # Applied to the value read; it must leave the field's default unchanged.
    normalize: Callable[[Any], Any] | None = None
    # A reader of its own, `read(env, default)`, for values made of several variables.
    read: Callable[[_Env, Any], Any] | None = None
    # The variables `read` reads, for the reference.
    documents: tuple[Documented, ...] = ()
    # compatibility.md D13: outside MLPA_DEBUG and the demo, the default of this secret is refused.
    refused_default: bool = False
    # The refusal applies only while this boolean variable is on (a feature's own secret).
    refused_only_with: str | None = None
    # The reference's heading for a field of `Settings` itself (a section class has `heading`).
    heading: str | None = None


def variable(
    name: str,
    default: Any,
    *,
    meaning: str,
    minimum: float | None = None,
    choices: tuple[str, ...] = (),
    follows: str | None = None,
    normalize: Callable[[Any], Any] | None = None,
    heading: str | None = None,
) -> Any:
    """A field read from the environment variable `name`; its kind is the field's type."""
    spec = Variable(name, meaning, minimum, choices, follows, normalize, heading=heading)
    return field(default=default, metadata={_VARIABLE: spec})


def secret(
    name: str, default: str, *, meaning: str, refused_default: bool, refused_only_with: str | None = None
) -> Any:
    """A string field that never shows in a repr."""
    spec = Variable(name, meaning, refused_default=refused_default, refused_only_with=refused_only_with)
    return field(default=default, repr=False, metadata={_VARIABLE: spec})


def derived(
    read: Callable[[_Env, Any], Any],
    *,
    documents: tuple[Documented, ...],
    default: Any = None,
    default_factory: Any = None,
    heading: str | None = None,
) -> Any:
    """A field made of several variables by `read(env, default)`; `documents` describes them
    for the configuration reference."""
    metadata = {_VARIABLE: Variable(None, read=read, documents=documents, heading=heading)}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _no_trailing_slash(url: str) -> str:
    return url.rstrip("/")


def _zero_means_none(seconds: float | None) -> float | None:
    return seconds or None


def _star_means_any(names: frozenset[str]) -> frozenset[str]:
    """`*` alone: no restriction (the empty set)."""
    return frozenset() if names == {"*"} else names


def _fxa_scopes(env: _Env, default: tuple[str, ...]) -> tuple[str, ...]:
    """The default scopes, then ADDITIONAL_FXA_SCOPE_1..3, each once."""
    extra = (env.str(f"ADDITIONAL_FXA_SCOPE_{i}", "") for i in (1, 2, 3))
    return tuple(dict.fromkeys((*default, *(scope for scope in extra if scope))))


def _capped_service_types(env: _Env, catalog: Catalog) -> frozenset[str]:
    """MLPA_CAPPED_SERVICE_TYPES: service type names; each unknown one is a problem. Unset:
    the catalogue's `capped` types."""
    names = env.str_set("MLPA_CAPPED_SERVICE_TYPES", None)
    if names is None:
        return catalog.capped_types
    capped = set()
    for name in names:
        if name not in catalog:
            env.problem(f"MLPA_CAPPED_SERVICE_TYPES: unknown service type {name!r}")
            continue
        capped.add(name)
    return frozenset(capped)


def _budgets(env: _Env, catalog: Catalog) -> Mapping[str, BudgetTier]:
    """USER_FEATURE_BUDGET_<SERVICE TYPE>_<FIELD> on top of each tier of the catalogue."""
    tiers = {}
    infixes = catalog.budget_infixes
    for service_type, tier in catalog.budgets.items():
        prefix = f"USER_FEATURE_BUDGET_{infixes[service_type]}_"
        tiers[service_type] = BudgetTier(
            budget_id=env.str(prefix + "BUDGET_ID", tier.budget_id),
            max_budget=env.float(prefix + "MAX_BUDGET", tier.max_budget, minimum=0.0),
            rpm_limit=env.int(prefix + "RPM_LIMIT", tier.rpm_limit, minimum=0),
            tpm_limit=env.int(prefix + "TPM_LIMIT", tier.tpm_limit, minimum=0),
            budget_duration=env.str(prefix + "BUDGET_DURATION", tier.budget_duration),
        )
    return MappingProxyType(tiers)


def catalog_file_path(environ: Mapping[str, str]) -> str | None:
    """MLPA_CATALOG_FILE as `Settings.catalog` reads it; none for the built-in catalogue."""
    return _Env(environ).optional_str("MLPA_CATALOG_FILE")


def catalog_file_problem(path: str, problem: str) -> str:
    """A problem of the catalogue file at `path`, as every report of it reads."""
    return f"MLPA_CATALOG_FILE ({path}): {problem}"


def _catalog(env: _Env, default: Catalog) -> Catalog:
    """The catalogue of MLPA_CATALOG_FILE (the built-in one when unset), with the budget
    and capped-type variables applied: the one every reader of the catalogue uses."""
    path = env.optional_str("MLPA_CATALOG_FILE")
    catalog = default
    if path is not None:
        try:
            catalog = load_catalog(path)
        except CatalogError as error:
            for problem in error.problems:
                env.problem(catalog_file_problem(path, problem))
    effective = catalog.with_variables(_budgets(env, catalog), _capped_service_types(env, catalog))
    env.catalog = effective
    return effective


def _catalog_capped_types(env: _Env, default: frozenset[str]) -> frozenset[str]:
    """The capped set `Settings.catalog` settled on (read before this section)."""
    return env.catalog.capped_types


def _admin_port(env: _Env, default: int | None) -> int | None:
    """MLPA_ADMIN_PORT: unset for none; a port other than PORT's."""
    port = env._parse("MLPA_ADMIN_PORT", None, "a port number", int)
    if port is None:
        return default
    if not 1 <= port <= 65535:
        env.problem(f"MLPA_ADMIN_PORT: must be a port number from 1 to 65535, got {port}")
        return default
    public = (env.raw("PORT") or "").strip() or "8080"
    if public.isdigit() and int(public) == port:
        env.problem(f"MLPA_ADMIN_PORT: must differ from PORT ({public}), got {port}")
        return default
    return port


# --- the sections ---------------------------------------------------------------------------
# Each section's `heading` and docstring head its part of the configuration reference; each
# variable's `meaning` is its line there (docs/configuration.md, config/example.env).


@dataclass(frozen=True, slots=True)
class DeadPeerOptions:
    """Dead-peer detection on client connections (process/client_sockets.py): TCP keepalive and
    TCP_USER_TIMEOUT."""

    idle_seconds: float
    interval_seconds: float
    count: int
    user_timeout_seconds: float

    def bound_seconds(self) -> float:
        """The longest a vanished client goes unnoticed after its last segment."""
        if self.user_timeout_seconds <= 0:
            return self.idle_seconds + self.interval_seconds * self.count
        # Mid-stream (data unacknowledged) the user timeout itself; idle, the first probe
        # tick after both the idle time and the user timeout have passed.
        return max(self.idle_seconds, self.user_timeout_seconds) + self.interval_seconds


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The HTTP listener, logging, request limits, response headers, connections to clients and
    the garbage collector. `MLPA_DEBUG` is read first: it changes defaults of later sections."""

    heading: ClassVar[str] = "Server"

    debug: bool = variable(
        "MLPA_DEBUG",
        False,
        meaning="Development mode: FxA's stage server, upstream error details in responses, and the"
        " documented default secrets accepted. Never in production.",
    )
    port: int = variable(
        "PORT", 8080, minimum=0, meaning="Listening port of `serve` (its `--port` overrides it) and of gunicorn."
    )
    log_json: bool = variable("LOG_JSON", False, meaning="One JSON object per log line (production) instead of console lines.")
    log_level: str = variable(
        "LOG_LEVEL",
        "INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        meaning="Lowest level logged, gunicorn's own loggers included.",
    )
    shutdown_drain_seconds: float = variable(
        "SHUTDOWN_DRAIN_SECONDS",
        20.0,
        minimum=0.0,
        meaning="On SIGTERM, how long open streams may run on before they are ended; gunicorn's graceful"
        " timeout is sized from it.",
    )
    max_request_size_bytes: int = variable(
        "MAX_REQUEST_SIZE_BYTES",
        3 * 1024 * 1024,
        minimum=1,
        meaning="Largest request body, by Content-Length and by bytes read (413 above).",
    )
    require_purpose_header: bool = variable(
        "MLPA_REQUIRE_PURPOSE_HEADER",
        False,
        meaning="Make the `purpose` header mandatory for the service types that have purposes.",
    )
    mock_routes: bool = variable("MLPA_MOCK_ROUTES", False, meaning="Mount the `/mock/*` load-testing routes.")
    mock_ttft_ms: int = variable(
        "MOCK_TTFT_MS", 200, minimum=0, meaning="Mock routes: delay before the reply or its first streamed chunk."
    )
    mock_streaming_chunk_latency_ms: int = variable(
        "MOCK_STREAMING_CHUNK_LATENCY_MS", 50, minimum=0, meaning="Mock routes: delay between streamed chunks."
    )
    security_headers_enabled: bool = variable(
        "SECURITY_HEADERS_ENABLED",
        True,
        meaning="Add `X-Content-Type-Options: nosniff` to responses, and `Strict-Transport-Security` on https.",
    )
    hsts_max_age: int = variable("HSTS_MAX_AGE", 31536000, minimum=0, meaning="`Strict-Transport-Security` max-age, in seconds.")
    hsts_include_subdomains: bool = variable(
        "HSTS_INCLUDE_SUBDOMAINS", True, meaning="Add `includeSubDomains` to `Strict-Transport-Security`."
    )
    keepalive_timeout_seconds: float = variable(
        "KEEPALIVE_TIMEOUT_SECONDS",
        75.0,
        minimum=0.0,
        meaning="Idle keep-alive of client connections. Keep it above the load balancer's idle timeout, so"
        " that the balancer, not the service, closes idle connections.",
    )
    # Dead-peer detection on client connections (process/client_sockets.py). Probes are answered by
    # any live client's kernel, so a healthy slow client is never cut.
    client_keepalive_idle_seconds: float = variable(
        "CLIENT_KEEPALIVE_IDLE_SECONDS",
        60.0,
        minimum=1.0,
        meaning="Dead-peer detection on client connections (Linux): seconds without anything from a client"
        " before TCP keepalive probes start. A vanished client is noticed within max(idle, user timeout)"
        " + interval seconds (130 by default).",
    )
    client_keepalive_interval_seconds: float = variable(
        "CLIENT_KEEPALIVE_INTERVAL_SECONDS", 10.0, minimum=1.0, meaning="Seconds between keepalive probes."
    )
    client_keepalive_count: int = variable(
        "CLIENT_KEEPALIVE_COUNT",
        6,
        minimum=1,
        meaning="Unanswered probes before the connection is dropped (counts only when"
        " `CLIENT_USER_TIMEOUT_SECONDS` is 0).",
    )
    client_user_timeout_seconds: float = variable(
        "CLIENT_USER_TIMEOUT_SECONDS",
        120.0,
        minimum=0.0,
        meaning="Data sent and unacknowledged this long ends the connection (TCP_USER_TIMEOUT); 0 turns it off.",
    )
    # The kernel's default somaxconn is 4096 since Linux 5.4 (docs/operations.md, "Scale"); a burst
    # needs the queue: docs/performance.md, "The burst and the listen backlog".
    listen_backlog: int = variable(
        "LISTEN_BACKLOG",
        4096,
        minimum=1,
        meaning="Accept queue of each listening socket (`serve` and gunicorn). A burst of new connections"
        " beyond it waits on SYN retransmits (1, 3, 7 s). The kernel caps it at `net.core.somaxconn`:"
        " raise that too when raising this.",
    )
    # For a heap of long-lived streams (process/gc_tuning.py).
    gc_freeze_after_startup: bool = variable(
        "GC_FREEZE_AFTER_STARTUP",
        True,
        meaning="Freeze what exists once the app has started, so the garbage collector no longer walks it.",
    )
    gc_young_threshold: int = variable(
        "GC_YOUNG_THRESHOLD",
        10000,
        minimum=0,
        meaning="Allocations between collections of the garbage collector's young generation (0: CPython's 700).",
    )

    # compatibility.md D59: the operators' routes on a listener of their own (routes/admin_port.py).
    admin_port: int | None = derived(
        _admin_port,
        documents=(
            Documented(
                "MLPA_ADMIN_PORT",
                "port 1-65535, not `PORT`",
                "A second listener (`serve` and gunicorn) for `/metrics`, `/admin`, `/user/*`, `/api/docs` and"
                " `/openapi.json`, which the public port then answers with 404; the health routes answer on"
                " both. Unset: everything on `PORT`, as the reference.",
            ),
        ),
    )

    def dead_peer_options(self) -> DeadPeerOptions:
        return DeadPeerOptions(
            self.client_keepalive_idle_seconds,
            self.client_keepalive_interval_seconds,
            self.client_keepalive_count,
            self.client_user_timeout_seconds,
        )


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """LiteLLM, and how the service talks to it (one shared connection pool)."""

    heading: ClassVar[str] = "LiteLLM upstream"

    api_base: str = variable(
        "LITELLM_API_BASE", "http://localhost:4000", normalize=_no_trailing_slash, meaning="Base URL of the LiteLLM proxy."
    )
    master_key: str = secret(
        "MASTER_KEY",
        "sk-default",
        refused_default=True,
        meaning="LiteLLM master key: LiteLLM admin calls, and the `master_key` header of the `/user` admin routes.",
    )
    virtual_key: str = secret(
        "MLPA_VIRTUAL_KEY", "sk-virtual", refused_default=True, meaning="LiteLLM virtual key for completions and search."
    )
    streaming_timeout_seconds: float = variable(
        "STREAMING_TIMEOUT_SECONDS",
        300.0,
        minimum=0.001,
        meaning="Longest upstream silence in a stream: before the first byte and between chunks.",
    )
    # compatibility.md D4: the non-streaming read timeout defaults to the streaming one.
    read_timeout_seconds: float = variable(
        "UPSTREAM_READ_TIMEOUT_SECONDS",
        300.0,
        minimum=0.001,
        follows="streaming_timeout_seconds",
        meaning="Longest wait for a non-streaming completion's response.",
    )
    connect_timeout_seconds: float = variable(
        "UPSTREAM_CONNECT_TIMEOUT_SECONDS", 10.0, minimum=0.001, meaning="Timeout of a TCP connect to LiteLLM."
    )
    max_connections: int = variable(
        "UPSTREAM_MAX_CONNECTIONS",
        20000,
        minimum=0,
        meaning="Connection pool size towards LiteLLM (0: unlimited). Each open stream holds one, so this"
        " caps open streams per worker.",
    )
    keepalive_timeout_seconds: float = variable(
        "UPSTREAM_KEEPALIVE_TIMEOUT_SECONDS",
        4.0,
        minimum=0.0,
        meaning="How long an idle pooled connection is kept for reuse; keep it below LiteLLM's own keep-alive.",
    )
    # Fixed: no variable sets these.
    admin_timeout_seconds: float = 30.0
    search_timeout_seconds: float = 30.0
    # Beyond the reference (docs/keepalive-and-retries.md says why off by default).
    retry_attempts: int = variable(
        "UPSTREAM_RETRY_ATTEMPTS",
        0,
        minimum=0,
        meaning="Retries of a completion after connection refused or reset, or LiteLLM 502/503, before the"
        " first byte (0: off; `docs/keepalive-and-retries.md`).",
    )
    retry_backoff_seconds: float = variable(
        "UPSTREAM_RETRY_BACKOFF_SECONDS",
        0.25,
        minimum=0.0,
        meaning="First retry's backoff; it doubles per retry, jittered to 50-100 %.",
    )
    retry_budget_seconds: float = variable(
        "UPSTREAM_RETRY_BUDGET_SECONDS",
        3.0,
        minimum=0.0,
        meaning="No retry starts (its backoff included) later than this after the first attempt.",
    )
    # MLPA 1.0.39 (compatibility.md §4.2): a client may name the LiteLLM key of its request.
    allow_custom_virtual_key: bool = variable(
        "ALLOW_CUSTOM_VIRTUAL_KEY",
        False,
        meaning="Honour the `litellm-virtual-key` request header on chat and search: its trimmed value (blank:"
        " `MLPA_VIRTUAL_KEY`) is the key sent to LiteLLM. Off: the header is ignored.",
    )

    def url(self, path: str) -> str:
        return self.api_base.rstrip("/") + path


@dataclass(frozen=True, slots=True)
class CompletionDefaults:
    """What the service sends LiteLLM when a chat completion request leaves it out."""

    heading: ClassVar[str] = "Completion defaults"

    temperature: float = variable("TEMPERATURE", 0.1, meaning="`temperature` when the request has none.")
    top_p: float = variable("TOP_P", 0.01, meaning="`top_p` when the request has none.")
    max_completion_tokens: int = variable(
        "MAX_COMPLETION_TOKENS",
        8192,
        minimum=1,
        meaning="`max_tokens` when the request has none, and the most it may ask for (a larger one is lowered).",
    )


@dataclass(frozen=True, slots=True)
class FxASettings:
    """Verification of Firefox Accounts OAuth tokens (the desktop clients' credentials)."""

    heading: ClassVar[str] = "Firefox Accounts"

    base_url: str = variable(
        "FXA_BASE_URL", FXA_PRODUCTION_URL, normalize=_no_trailing_slash, meaning="FxA OAuth server, `/v1` included."
    )
    scopes: tuple[str, ...] = derived(
        _fxa_scopes,
        default=("profile:uid",),
        documents=tuple(
            Documented(
                f"ADDITIONAL_FXA_SCOPE_{i}",
                "text",
                "A scope a token may carry instead of `profile:uid`; each scope is verified concurrently and"
                " the first to pass wins.",
            )
            for i in (1, 2, 3)
        ),
    )
    verify_cache_seconds: float = variable(
        "FXA_VERIFY_CACHE_SECONDS", 300.0, minimum=0.0, meaning="How long a successful verification is cached in the process."
    )
    jwks_cache_seconds: float = variable(
        "FXA_JWKS_CACHE_SECONDS", 600.0, minimum=0.0, meaning="How long FxA's signing keys (JWKS) are cached."
    )
    request_timeout_seconds: float = variable(
        "FXA_REQUEST_TIMEOUT_SECONDS", 10.0, minimum=0.001, meaning="Timeout of each call to FxA."
    )


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """The admin page's key, the dev tiers' token, and the service's own access tokens (issued
    to Android clients after Play Integrity)."""

    heading: ClassVar[str] = "Keys and tokens"

    ui_access_key: str = secret(
        "MLPA_UI_ACCESS_KEY",
        "sk-ui-access-default",
        refused_default=True,
        meaning="Key of the read-only admin routes (counts, signup-cap status): the `mlpa_ui_access_key` header.",
    )
    access_token_secret: str = secret(
        "MLPA_ACCESS_TOKEN_SECRET",
        "mlpa-dev-secret",
        refused_default=True,
        meaning="HS256 key of the service's own access tokens, at least 32 bytes. A new one invalidates every"
        " outstanding token (`docs/migration.md`).",
    )
    experimentation_token: str = secret(
        "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN",
        "secret-dev-token",
        refused_default=True,
        meaning="`x-dev-authorization` value for the `*-dev` service types; empty turns those types off"
        " (production does).",
    )
    access_token_ttl_seconds: int = variable(
        "MLPA_ACCESS_TOKEN_TTL_SECONDS", 86400, minimum=1, meaning="Lifetime of an access token."
    )


# The budget tier variables, USER_FEATURE_BUDGET_<TYPE>_<FIELD> (see `_budgets`).
_BUDGET_VARIABLES = (
    Documented(
        "USER_FEATURE_BUDGET_<TYPE>_BUDGET_ID",
        "text",
        "LiteLLM budget id of the service type.",
        "the catalogue's tier",
        tier_field="budget_id",
    ),
    Documented(
        "USER_FEATURE_BUDGET_<TYPE>_MAX_BUDGET",
        "number ≥ 0",
        "Spend limit of one user per budget period, in USD.",
        "the catalogue's tier",
        tier_field="max_budget",
    ),
    Documented(
        "USER_FEATURE_BUDGET_<TYPE>_RPM_LIMIT",
        "integer ≥ 0",
        "Requests per minute of one user.",
        "the catalogue's tier",
        tier_field="rpm_limit",
    ),
    Documented(
        "USER_FEATURE_BUDGET_<TYPE>_TPM_LIMIT",
        "integer ≥ 0",
        "Tokens per minute of one user.",
        "the catalogue's tier",
        tier_field="tpm_limit",
    ),
    Documented(
        "USER_FEATURE_BUDGET_<TYPE>_BUDGET_DURATION",
        "text",
        "Budget period, in LiteLLM's notation (`1d`, `7d`).",
        "the catalogue's tier",
        tier_field="budget_duration",
    ),
)


@dataclass(frozen=True, slots=True)
class SignupCapSettings:
    """A cap on distinct signed-in users, for the capped service types."""

    heading: ClassVar[str] = "Signup cap"

    enforce: bool = variable(
        "MLPA_ENFORCE_SIGNIN_CAP", False, meaning="Refuse new signed-in users beyond `MLPA_MAX_SIGNED_IN_USERS`."
    )
    max_signed_in_users: int = variable(
        "MLPA_MAX_SIGNED_IN_USERS",
        1_000_000,
        minimum=0,
        meaning="Most distinct signed-in users while the cap is enforced (`migrate` seeds it).",
    )
    # MLPA_CAPPED_SERVICE_TYPES, else the catalogue's capped types (read with `Settings.catalog`).
    capped_service_types: frozenset[str] = derived(
        _catalog_capped_types,
        default=frozenset({ServiceType.AI.value, ServiceType.MEMORIES.value}),
        documents=(
            Documented(
                "MLPA_CAPPED_SERVICE_TYPES",
                "list of service types",
                "Service types that need a signup slot.",
                "the catalogue's `capped` types (" + ", ".join(f"`{t}`" for t in sorted(BUILTIN_CATALOG.capped_types))
                + " in the built-in one)",
            ),
        ),
    )
    admission_lock_timeout_ms: int = variable(
        "MLPA_ADMISSION_LOCK_TIMEOUT_MS",
        5000,
        minimum=1,
        meaning="Longest wait for the signup-cap admission lock; a timeout is a 500.",
    )


# libpq's sslmode values, weakest first (docs/operations.md, "TLS to PostgreSQL").
PG_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# The modes that never verify the server, where a root certificate would only look like safety.
_UNVERIFIED_SSL_MODES = frozenset({"disable", "allow", "prefer"})


@dataclass(frozen=True, slots=True)
class PostgresTLS:
    """TLS towards PostgreSQL: libpq's mode and the files it uses (paths as given)."""

    mode: str = "prefer"
    root_cert: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def verifies_host(self) -> bool:
        return self.mode == "verify-full"

    def ssl_argument(self) -> str | ssl.SSLContext:
        """asyncpg's `ssl=`: libpq's mode name for the modes asyncpg negotiates itself
        (`prefer` may fall back to plain text), else a context built from these files only:
        nothing from PGSSL* variables or ~/.postgresql, so what is verified is what is set."""
        if self.mode in _UNVERIFIED_SSL_MODES:
            return self.mode
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self.mode == "verify-full"
        if self.mode == "require" and self.root_cert is None:
            context.verify_mode = ssl.CERT_NONE
        elif self.root_cert is not None:
            context.load_verify_locations(cafile=self.root_cert)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if self.cert is not None:
            context.load_cert_chain(self.cert, keyfile=self.key)
        return context

    def environ(self) -> dict[str, str]:
        """The DB_SSL_* variables that read back as this value."""
        values = {"DB_SSL_MODE": self.mode, "DB_SSL_ROOT_CERT": self.root_cert, "DB_SSL_CERT": self.cert,
                  "DB_SSL_KEY": self.key}
        return {name: value for name, value in values.items() if value is not None}


def _postgres_tls(env: _Env, default: PostgresTLS) -> PostgresTLS:
    """DB_SSL_MODE and its files; a file that cannot be loaded is a problem at start, not a
    failed connection later."""
    tls = PostgresTLS(
        mode=env.choice("DB_SSL_MODE", default.mode, PG_SSL_MODES),
        root_cert=env.optional_str("DB_SSL_ROOT_CERT"),
        cert=env.optional_str("DB_SSL_CERT"),
        key=env.optional_str("DB_SSL_KEY"),
    )
    problems_before = len(env.problems)
    if tls.mode in _UNVERIFIED_SSL_MODES:
        for name, value in (("DB_SSL_ROOT_CERT", tls.root_cert), ("DB_SSL_CERT", tls.cert)):
            if value is not None:
                env.problem(
                    f"{name}: set, but DB_SSL_MODE={tls.mode} does not use it; use require, verify-ca or verify-full"
                )
    if (tls.cert is None) != (tls.key is None):
        env.problem("DB_SSL_CERT and DB_SSL_KEY: set both (a client certificate and its key) or neither")
    if len(env.problems) > problems_before:
        return default
    for name, path in (("DB_SSL_ROOT_CERT", tls.root_cert), ("DB_SSL_CERT", tls.cert), ("DB_SSL_KEY", tls.key)):
        if path is not None:
            try:
                with open(path, "rb"):
                    pass
            except OSError as error:
                env.problem(f"{name}: cannot read {path!r}: {error.strerror or error}")
    if len(env.problems) > problems_before:
        return default
    try:
        tls.ssl_argument()
    except (ssl.SSLError, ValueError) as error:
        names = "DB_SSL_ROOT_CERT" if tls.cert is None else "DB_SSL_ROOT_CERT, DB_SSL_CERT or DB_SSL_KEY"
        env.problem(f"{names}: not usable PEM ({error})")
        return default
    return tls


@dataclass(frozen=True, slots=True)
class PostgresSettings:
    """One PostgreSQL server holds LiteLLM's database and the service's own; one pool each."""

    heading: ClassVar[str] = "PostgreSQL"

    host: str = variable("DB_HOST", "localhost", meaning="PostgreSQL host.")
    port: int = variable("DB_PORT", 5432, minimum=1, meaning="PostgreSQL port.")
    username: str = variable("DB_USERNAME", "litellm", meaning="PostgreSQL user.")
    password: str = secret("DB_PASSWORD", "litellm", refused_default=False, meaning="PostgreSQL password.")
    litellm_db_name: str = variable("LITELLM_DB_NAME", "litellm", meaning="LiteLLM's database (end users, budgets).")
    app_attest_db_name: str = variable(
        "APP_ATTEST_DB_NAME",
        "app_attest",
        meaning="The service's own database (App Attest keys, signup capacity); `migrate` creates it if missing.",
    )
    pool_min_size: int = variable("PG_POOL_MIN_SIZE", 1, minimum=0, meaning="Connections each pool keeps open.")
    pool_max_size: int = variable("PG_POOL_MAX_SIZE", 10, minimum=1, meaning="Most connections of each pool.")
    prepared_stmt_cache_max_size: int = variable(
        "PG_PREPARED_STMT_CACHE_MAX_SIZE",
        100,
        minimum=0,
        meaning="Prepared statements asyncpg caches per connection; 0 behind PgBouncer's transaction pooling.",
    )
    readiness_check_timeout_s: float = variable(
        "READINESS_CHECK_TIMEOUT_S", 2.0, minimum=0.001, meaning="Bound of each `/health/readiness` check."
    )
    statement_timeout_ms: int = variable(
        "PG_STATEMENT_TIMEOUT_MS", 3000, minimum=0, meaning="Server-side statement timeout of the service's sessions."
    )
    idle_in_tx_timeout_ms: int = variable(
        "PG_IDLE_IN_TX_TIMEOUT_MS",
        10000,
        minimum=0,
        meaning="Server-side idle-in-transaction timeout of the service's sessions.",
    )
    maintenance_statement_timeout_ms: int = variable(
        "PG_MAINTENANCE_STATEMENT_TIMEOUT_MS",
        30000,
        minimum=0,
        meaning="Statement timeout of `migrate` and of the reconciliation and rebuild queries at start.",
    )
    admin_read_timeout_ms: int = variable(
        "PG_ADMIN_READ_TIMEOUT_MS", 15000, minimum=0, meaning="Statement timeout of the admin list and count queries."
    )
    command_timeout_s: float | None = variable(
        "PG_COMMAND_TIMEOUT_S",
        None,
        minimum=0.0,
        normalize=_zero_means_none,
        meaning="Client-side timeout of each asyncpg call (unset or 0: none); if set, keep it above 30.",
    )

    # TLS towards the server (DB_SSL_*), for both pools and `migrate`.
    tls: PostgresTLS = derived(
        _postgres_tls,
        default=PostgresTLS(),
        documents=(
            Documented(
                "DB_SSL_MODE",
                "one of " + ", ".join(f"`{mode}`" for mode in PG_SSL_MODES),
                "TLS to PostgreSQL, libpq's sslmode names: `prefer` tries TLS without verifying it;"
                " `require` encrypts; `verify-ca` also checks the server's certificate against"
                " `DB_SSL_ROOT_CERT`; `verify-full` also checks that it names `DB_HOST`"
                " (docs/operations.md, 'TLS to PostgreSQL').",
                "`prefer`",
                "prefer",
            ),
            Documented(
                "DB_SSL_ROOT_CERT",
                "path",
                "PEM file of the CA(s) the server's certificate must chain to (`verify-ca`, `verify-full`;"
                " with `require` it verifies the chain, as libpq does). Unset: `verify-ca` and `verify-full`"
                " trust the system's CAs; `require` verifies nothing.",
            ),
            Documented(
                "DB_SSL_CERT",
                "path",
                "PEM client certificate, for a server that asks for one (needs `DB_SSL_KEY`; `require` or above).",
            ),
            Documented("DB_SSL_KEY", "path", "PEM private key of `DB_SSL_CERT` (unencrypted)."),
        ),
    )

    def connection_environ(self) -> dict[str, str]:
        """The variables that name this server and its two databases, as this class reads
        them: for a process that must reach the same databases (the dev stack's exports)."""
        wanted = ("host", "port", "username", "password", "litellm_db_name", "app_attest_db_name")
        by_field = {spec.name: spec.metadata[_VARIABLE].name for spec in fields(self) if spec.name in wanted}
        environ = {by_field[name]: str(getattr(self, name)) for name in wanted}
        return environ | self.tls.environ()


@dataclass(frozen=True, slots=True)
class AppAttestSettings:
    """Apple App Attest, the iOS clients' credentials."""

    heading: ClassVar[str] = "App Attest (iOS)"

    development_team: str = variable(
        "APP_DEVELOPMENT_TEAM",
        "TEAMID1234",
        meaning="Apple developer team id; an app id is `<team id>.<bundle id>`. Production refuses it unset,"
        " this default or a placeholder, unless `APP_ATTEST_ENABLED=false` (docs/operations.md, 'Platforms').",
    )
    production: bool = variable(
        "APP_ATTEST_PRODUCTION", False, meaning="Require the production App Attest environment, not development."
    )
    challenge_expiry_seconds: int = variable(
        "CHALLENGE_EXPIRY_SECONDS", 300, minimum=1, meaning="Lifetime of an App Attest challenge."
    )
    qa: bool = variable(
        "APP_ATTEST_QA",
        False,
        meaning="Accept the QA root CA for requests sending `use-qa-certificates: true` (testing only).",
    )
    root_ca_path: str | None = variable(
        "APP_ATTEST_ROOT_CA_PATH",
        None,
        meaning="PEM file of Apple's App Attest root CA; unset: the copy shipped in the package.",
    )
    qa_root_ca_path: str | None = variable(
        "APP_ATTEST_QA_ROOT_CA_PATH", None, meaning="PEM file of the QA root CA, used with `APP_ATTEST_QA`."
    )
    bundle_ids: frozenset[str] = variable(
        "APP_ATTEST_BUNDLE_IDS",
        frozenset(),
        normalize=_star_means_any,
        meaning="Bundle ids allowed; `*`: any (the reference's behaviour). Production must set it while"
        " App Attest is on; unset (debug, demo): any.",
    )
    check_assertion_app_id: bool = variable(
        "APP_ATTEST_CHECK_ASSERTION_APP_ID",
        True,
        meaning="An assertion must be for the app id the request names (Apple's step 5, which the reference"
        " skipped); `false` only while clients transition (`docs/migration.md`).",
    )
    enabled: bool = variable(
        "APP_ATTEST_ENABLED",
        True,
        meaning="Serve iOS clients (App Attest). `false` runs without them: every attestation and assertion is"
        " refused (403), and start-up no longer asks for `APP_DEVELOPMENT_TEAM` and `APP_ATTEST_BUNDLE_IDS`.",
    )


@dataclass(frozen=True, slots=True)
class PlaySettings:
    """Google Play Integrity, the Android clients' credentials, verified once per access token."""

    heading: ClassVar[str] = "Play Integrity (Android)"

    package_name: str = variable(
        "PLAY_INTEGRITY_PACKAGE_NAME", "org.mozilla.firefox", meaning="Package of a request that names none."
    )
    allowed_package_names: frozenset[str] = variable(
        "ALLOWED_PACKAGE_NAMES",
        frozenset({"org.mozilla.fenix", "org.mozilla.fenix.debug", "org.mozilla.firefox", "org.mozilla.firefox_beta"}),
        meaning="Packages whose verdicts are accepted.",
    )
    api_base: str = variable(
        "PLAY_INTEGRITY_API_BASE", "https://playintegrity.googleapis.com", meaning="Play Integrity API base URL."
    )
    request_timeout_seconds: float = variable(
        "PLAY_INTEGRITY_REQUEST_TIMEOUT_SECONDS", 30.0, minimum=0.001, meaning="Timeout of each call to Google."
    )
    quota_project: str | None = variable(
        "PLAY_INTEGRITY_QUOTA_PROJECT",
        None,
        meaning="Sent as `x-goog-user-project` on Play Integrity calls; unset: not sent.",
    )
    max_age_seconds: int = variable(
        "PLAY_INTEGRITY_MAX_AGE_SECONDS", 300, minimum=1, meaning="Oldest verdict accepted, by its request timestamp."
    )
    google_credentials: str | None = variable(
        "PLAY_INTEGRITY_CREDENTIALS_FILE",
        None,
        meaning="Service-account JSON file for the Play Integrity API; unset: Application Default Credentials."
        " Production refuses to start without either, unless `PLAY_INTEGRITY_ENABLED=false`.",
    )
    enabled: bool = variable(
        "PLAY_INTEGRITY_ENABLED",
        True,
        meaning="Serve Android clients (Play Integrity). `false` runs without them: `/verify/play` answers 403,"
        " and start-up no longer asks for Google credentials.",
    )


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    """Error reports and metrics."""

    heading: ClassVar[str] = "Observability"

    sentry_dsn: str = secret(
        "SENTRY_DSN", "", refused_default=False, meaning="Sentry DSN for error reports; empty: no Sentry."
    )
    prometheus_multiproc_dir: str | None = variable(
        "PROMETHEUS_MULTIPROC_DIR",
        None,
        meaning="Directory of the metrics' multi-process files, for several workers; emptied at start."
        " Unset: one process.",
    )
    # MLPA 1.0.39: the `client_country` of the by-country chat metrics keeps these, else "other".
    launch_countries: frozenset[str] = variable(
        "MLPA_LAUNCH_COUNTRIES",
        frozenset({"US", "CA", "FR", "DE"}),
        meaning="Countries (`X-Geo-Country` values, case-sensitive) the by-country chat metrics name;"
        " any other country, or none, is `other`. Comma-separated.",
    )


@dataclass(frozen=True, slots=True)
class StreamLimitSettings:
    """Beyond the reference: limits and keep-alive lines of streams, and how they are relayed."""

    heading: ClassVar[str] = "Streams"

    max_concurrent_streams_per_user: int = variable(
        "MAX_CONCURRENT_STREAMS_PER_USER",
        0,
        minimum=0,
        meaning="Open streams one user (`uid:service_type`) may hold per worker; the next gets 429, error 11"
        " (0: no cap).",
    )
    keepalive_seconds: float = variable(
        "STREAM_KEEPALIVE_SECONDS",
        0.0,
        minimum=0.0,
        meaning="Seconds between keep-alive empty lines while a stream waits for its first upstream byte (0: off).",
    )
    keepalive_service_types: frozenset[str] = variable(
        "STREAM_KEEPALIVE_SERVICE_TYPES",
        frozenset(),
        meaning="Service types whose streams always get keep-alive lines; any stream may ask with"
        " `X-MLPA-Keepalive: 1`.",
    )
    relay_fast_path: bool = variable(
        "RELAY_FAST_PATH",
        True,
        meaning="Relay stream bodies from the upstream connection's callbacks (`relay/fast_path.py`), for less"
        " CPU per event. It relies on aiohttp internals: with an aiohttp outside the tested range every"
        " stream takes the regular relay (one WARNING at start), as HTTP/1.0 clients and compressed"
        " upstream bodies always do. `false`: the regular relay for every stream.",
    )


def _lag_hysteresis(env: _Env, default: tuple[float, float]) -> tuple[float, float]:
    """OVERLOAD_LAG_ENTER_MS and OVERLOAD_LAG_LEAVE_MS, in seconds; leave must be below enter."""
    enter = env.float("OVERLOAD_LAG_ENTER_MS", default[0] * 1000, minimum=1.0)
    leave = env.float("OVERLOAD_LAG_LEAVE_MS", default[1] * 1000, minimum=0.0)
    assert enter is not None and leave is not None
    if leave >= enter:
        env.problem(f"OVERLOAD_LAG_LEAVE_MS: must be below OVERLOAD_LAG_ENTER_MS ({enter:g}), got {leave:g}")
        return default
    return enter / 1000, leave / 1000


_LAG_ENTER_LEAVE_MS = (200, 50)


@dataclass(frozen=True, slots=True)
class OverloadSettings:
    """Beyond the reference: shed new requests with a 503 while this worker is overloaded
    (`process/overload.py`; `docs/scaling.md` says how to choose the bounds). Every bound is per worker."""

    heading: ClassVar[str] = "Overload protection"

    enabled: bool = variable(
        "OVERLOAD_PROTECTION",
        False,
        meaning="While this worker is overloaded, new requests (not probes or `/metrics`) get 503 with"
        " `Retry-After`, and readiness answers 503.",
    )
    # Event-loop lag: overloaded above `enter`, and again not once it stayed below `leave`
    # for `recover_seconds` (seconds; read from the two *_MS variables).
    lag_enter_leave_seconds: tuple[float, float] = derived(
        _lag_hysteresis,
        default=(_LAG_ENTER_LEAVE_MS[0] / 1000, _LAG_ENTER_LEAVE_MS[1] / 1000),
        documents=(
            Documented(
                "OVERLOAD_LAG_ENTER_MS",
                "number ≥ 1",
                "Overloaded while the event loop's lag (the one sampler's lateness) exceeds this.",
                f"`{_LAG_ENTER_LEAVE_MS[0]}`",
                str(_LAG_ENTER_LEAVE_MS[0]),
            ),
            Documented(
                "OVERLOAD_LAG_LEAVE_MS",
                "number ≥ 0, below the enter bound",
                "No longer overloaded once the lag stayed below this for `OVERLOAD_RECOVER_SECONDS`.",
                f"`{_LAG_ENTER_LEAVE_MS[1]}`",
                str(_LAG_ENTER_LEAVE_MS[1]),
            ),
        ),
    )
    recover_seconds: float = variable(
        "OVERLOAD_RECOVER_SECONDS",
        5.0,
        minimum=0.0,
        meaning="How long the lag must stay below the leave bound; readiness also stays 503 this long after"
        " any bound last held.",
    )
    sample_interval_ms: int = variable(
        "OVERLOAD_LAG_SAMPLE_MS", 100, minimum=10, meaning="How often the one sampler task measures the lag."
    )
    max_open_streams: int = variable(
        "OVERLOAD_MAX_OPEN_STREAMS",
        0,
        minimum=0,
        meaning="Overloaded while the worker holds this many open streams (0: no bound).",
    )
    max_admissions: int = variable(
        "OVERLOAD_MAX_ADMISSIONS",
        0,
        minimum=0,
        meaning="Overloaded while this many requests are between arrival and their response headers (0: no bound).",
    )
    # What the worker has not even accepted yet, sampled from the kernel.
    max_accept_queue: int = variable(
        "OVERLOAD_MAX_ACCEPT_QUEUE",
        200,
        minimum=0,
        meaning="Overloaded while this many connections wait in the listening socket's accept queue at two"
        " samples in a row (0: no bound).",
    )
    retry_after_seconds: int = variable(
        "OVERLOAD_RETRY_AFTER_SECONDS", 2, minimum=0, meaning="`Retry-After` of a shed request's 503, in seconds."
    )

    @property
    def lag_enter_seconds(self) -> float:
        return self.lag_enter_leave_seconds[0]

    @property
    def lag_leave_seconds(self) -> float:
        return self.lag_enter_leave_seconds[1]


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """The Redis the fleet shares (the reference's traffic contracts; meant to be LiteLLM's own).
    Contacted only by the features that need it (`fleet/redis_link.py`)."""

    heading: ClassVar[str] = "Redis"

    host: str = variable("REDIS_HOST", "localhost", meaning="Redis host (the reference shares LiteLLM's Redis).")
    port: int = variable("REDIS_PORT", 6379, minimum=1, meaning="Redis port.")
    password: str = secret(
        "REDIS_PASSWORD", "", refused_default=False, meaning="Redis `AUTH` password; empty: none (beyond the reference)."
    )
    timeout_ms: int = variable(
        "REDIS_TIMEOUT_MS",
        100,
        minimum=1,
        meaning="Beyond the reference: the longest any request waits on one Redis call (connect included);"
        " past it the call counts as a failure and the feature takes its fallback.",
    )
    retry_seconds: float = variable(
        "REDIS_RETRY_SECONDS",
        1.0,
        minimum=0.0,
        meaning="Beyond the reference: after a failure, requests skip Redis (and take the fallback at once) for"
        " this long; then one request tries again.",
    )


@dataclass(frozen=True, slots=True)
class PrivacyFilterSettings:
    """`POST /privacy-filter` (compatibility.md §1.11): FxA-signed-in clients mask sensitive data through a
    separate Privacy Filter service. Off by default; readiness checks the service only when on."""

    heading: ClassVar[str] = "Privacy Filter"

    enabled: bool = variable(
        "PRIVACY_FILTER_ENABLED",
        False,
        meaning="Serve `POST /privacy-filter` (503 while off) and add the Privacy Filter's `/readyz` to readiness.",
    )
    master_key: str = secret(
        "PRIVACY_FILTER_MASTER_KEY",
        "sk-default",
        refused_default=True,
        refused_only_with="PRIVACY_FILTER_ENABLED",
        meaning="Sent to the Privacy Filter as `x-pf-api-key`; its default is refused only while the filter is on.",
    )
    api_base: str = variable(
        "PRIVACY_FILTER_API_BASE",
        "http://localhost:5000",
        normalize=_no_trailing_slash,
        meaning="Base URL of the Privacy Filter service (`/privacy-filter`, `/readyz`).",
    )
    # compatibility.md D46: one bound for the whole call, where the reference had per-phase 30 s timeouts.
    timeout_seconds: float = variable(
        "PRIVACY_FILTER_TIMEOUT_SECONDS",
        30.0,
        minimum=0.001,
        meaning="Longest a `POST /privacy-filter` waits for the Privacy Filter's whole answer (then 502).",
    )

    def url(self, path: str) -> str:
        return self.api_base + path


@dataclass(frozen=True, slots=True)
class ReadinessSettings:
    """What `/health/readiness` answers 503 for (compatibility.md D64)."""

    heading: ClassVar[str] = "Readiness"

    requires_dependencies: bool = variable(
        "READINESS_REQUIRES_DEPENDENCIES",
        False,
        meaning="`true`: readiness also answers 503 while a database or LiteLLM does not answer, as the"
        " reference did; a shared outage then takes every pod out of the Service at once, and clients get"
        " the load balancer's error page. `false`: readiness follows this pod's own health (draining,"
        " overloaded, schema behind); the dependencies' state is in the body and in `mlpa_dependency_up`.",
    )


@dataclass(frozen=True, slots=True)
class TrafficContractSettings:
    """The reference's traffic contracts (`docs/traffic-contracts.md`): fleet-wide request and
    token counters per feature and for all features together (the basket), in Redis. Limits
    count per window; 0 is no limit for that dimension."""

    heading: ClassVar[str] = "Traffic contracts"

    enabled: bool = variable(
        "ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT",
        False,
        meaning="Check and count every chat and search request against the contracts (Redis must answer at"
        " start). Observes only: an over-contract request is logged and labelled, not refused (see"
        " `TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT`).",
    )
    key_prefix: str = variable(
        "TRAFFIC_CONTRACT_REDIS_KEY_PREFIX", "mlpa:traffic_contract", meaning="Namespace of the counters' Redis keys."
    )
    rpm_window_seconds: int = variable(
        "TRAFFIC_CONTRACT_RPM_WINDOW_SECONDS", 60, minimum=1, meaning="Length of the request counters' window."
    )
    tpm_window_seconds: int = variable(
        "TRAFFIC_CONTRACT_TPM_WINDOW_SECONDS", 60, minimum=1, meaning="Length of the token counters' window."
    )
    counter_ttl_seconds: int = variable(
        "TRAFFIC_CONTRACT_COUNTER_TTL_SECONDS",
        120,
        minimum=1,
        meaning="Expiry of a window's counters, renewed by every count.",
    )
    fail_open: bool = variable(
        "TRAFFIC_CONTRACT_FAIL_OPEN_ON_REDIS_ERROR",
        True,
        meaning="When Redis fails a check: continue unchecked (true) or answer 503 (false).",
    )
    total_rpm_limit: int = variable(
        "TOTAL_TRAFFIC_CONTRACT_RPM_LIMIT", 0, minimum=0, meaning="Requests per window of all features together."
    )
    total_tpm_limit: int = variable(
        "TOTAL_TRAFFIC_CONTRACT_TPM_LIMIT", 0, minimum=0, meaning="Tokens per window of all features together."
    )
    smart_window_feature: str = variable(
        "FEATURE_SMART_WINDOW", "smart-window", meaning="Counter name of the `smart-window` feature."
    )
    smart_window_rpm_limit: int = variable(
        "SMART_WINDOW_TRAFFIC_CONTRACT_RPM_LIMIT", 0, minimum=0, meaning="Requests per window of `smart-window`."
    )
    smart_window_tpm_limit: int = variable(
        "SMART_WINDOW_TRAFFIC_CONTRACT_TPM_LIMIT", 0, minimum=0, meaning="Tokens per window of `smart-window`."
    )
    s2s_feature: str = variable("FEATURE_S2S", "s2s", meaning="Counter name of the `s2s` feature.")
    s2s_rpm_limit: int = variable(
        "S2S_TRAFFIC_CONTRACT_RPM_LIMIT", 0, minimum=0, meaning="Requests per window of `s2s`."
    )
    s2s_tpm_limit: int = variable("S2S_TRAFFIC_CONTRACT_TPM_LIMIT", 0, minimum=0, meaning="Tokens per window of `s2s`.")
    s2s_android_feature: str = variable(
        "FEATURE_S2S_ANDROID", "s2s-android", meaning="Counter name of the `s2s-android` feature."
    )
    s2s_android_rpm_limit: int = variable(
        "S2S_ANDROID_TRAFFIC_CONTRACT_RPM_LIMIT", 0, minimum=0, meaning="Requests per window of `s2s-android`."
    )
    s2s_android_tpm_limit: int = variable(
        "S2S_ANDROID_TRAFFIC_CONTRACT_TPM_LIMIT", 0, minimum=0, meaning="Tokens per window of `s2s-android`."
    )
    reject_over_contract: bool = variable(
        "TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT",
        False,
        meaning="Beyond the reference: enforce the basket. Each request's count is reserved as it is admitted,"
        " and a request over a basket limit gets 429, error 12, with `Retry-After` (the seconds until the"
        " window ends); a stream without a usage chunk counts an estimate of its tokens.",
    )


@dataclass(frozen=True, slots=True)
class StreamCapSettings:
    """Beyond the reference: where `MAX_CONCURRENT_STREAMS_PER_USER` counts a user's open streams
    (`fleet/stream_cap.py`; `docs/scaling.md` says what each scope guarantees and when it degrades)."""

    heading: ClassVar[str] = "Stream cap scope"

    scope: str = variable(
        "STREAM_CAP_SCOPE",
        "worker",
        choices=("worker", "fleet"),
        meaning="`worker`: the cap counts each worker's streams alone (a user may hold cap x workers x pods)."
        " `fleet`: one count across every worker and pod, kept in the shared Redis as a lease per stream;"
        " while Redis is unavailable or slow each worker falls back to its own count.",
    )
    lease_seconds: float = variable(
        "STREAM_LEASE_SECONDS",
        30.0,
        minimum=3.0,
        meaning="`fleet` scope: a stream's lease lifetime, renewed every third of it while the stream runs."
        " It bounds how long a killed worker's streams still count against their users.",
    )


# `python -m mlpa_aiohttp demo` runs without a database and answers from the mock routes.
DEMO_DEFAULTS: Mapping[str, Any] = MappingProxyType({"MLPA_STORE": "memory", "MLPA_MOCK_ROUTES": True})
# MLPA_DEBUG=true talks to FxA's stage server.
DEBUG_DEFAULTS: Mapping[str, Any] = MappingProxyType({"FXA_BASE_URL": FXA_STAGE_URL})


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    completion: CompletionDefaults = CompletionDefaults()
    fxa: FxASettings = FxASettings()
    auth: AuthSettings = AuthSettings()
    # Before `signup_cap`, whose capped types it settles (`_Env.catalog`).
    catalog: Catalog = derived(
        _catalog,
        default=BUILTIN_CATALOG,
        heading="Catalogue and budgets",
        documents=(
            Documented(
                "MLPA_CATALOG_FILE",
                "path",
                "A TOML catalogue replacing the built-in one: service types, purposes, budget tiers, models"
                " (`docs/catalog.md`; `config/catalog.toml` is the built-in one). Checked at start, every"
                " mistake listed.",
                "the built-in catalogue",
            ),
            *_BUDGET_VARIABLES,
        ),
    )
    signup_cap: SignupCapSettings = SignupCapSettings()
    store: str = variable(
        "MLPA_STORE",
        "postgres",
        choices=("postgres", "memory"),
        heading="User store",
        meaning="Where users live: PostgreSQL, or memory (tests and the demo: nothing persists).",
    )
    postgres: PostgresSettings = PostgresSettings()
    app_attest: AppAttestSettings = AppAttestSettings()
    play: PlaySettings = PlaySettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    stream_limits: StreamLimitSettings = StreamLimitSettings()
    overload: OverloadSettings = OverloadSettings()
    redis: RedisSettings = RedisSettings()
    privacy_filter: PrivacyFilterSettings = PrivacyFilterSettings()
    readiness: ReadinessSettings = ReadinessSettings()
    traffic_contracts: TrafficContractSettings = TrafficContractSettings()
    stream_cap: StreamCapSettings = StreamCapSettings()

    @property
    def budgets(self) -> Mapping[str, BudgetTier]:
        """Each service type's budget tier, the variables applied (`catalog`'s)."""
        return self.catalog.budgets

    def secret_values(self) -> tuple[str, ...]:
        """The value of every field declared with `secret(...)`, for the log and Sentry
        scrubbers: a secret added to the settings is hidden without another list."""
        return tuple(_secret_values(self))

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], *, demo: bool = False, check_secrets: bool = True
    ) -> Settings:
        """`check_secrets=False` is for commands that use no secret but the database's
        (`migrate`), so a migration job need not carry the service's keys."""
        reading = cls.read_environ(environ, demo=demo, check_secrets=check_secrets)
        if reading.problems:
            raise SettingsError(reading.problems)
        return reading.settings

    @classmethod
    def read_environ(
        cls, environ: Mapping[str, str], *, demo: bool = False, check_secrets: bool = True
    ) -> SettingsReading:
        """`from_environ` without raising: each invalid value is replaced by its default and
        described in `problems`. For gunicorn's config file, whose values must be set
        before its `on_starting` hook reports every problem at once."""
        env = _Env(environ)
        settings = cls._read(env, demo=demo, check_secrets=check_secrets)
        return SettingsReading(settings, tuple(env.problems))

    @classmethod
    def _read(cls, env: _Env, *, demo: bool, check_secrets: bool = True) -> Settings:
        defaults = dict(DEMO_DEFAULTS) if demo else {}
        server = _read_section(env, ServerSettings, defaults)
        if server.debug:
            defaults.update(DEBUG_DEFAULTS)
        settings = _read_section(env, cls, defaults, already_read={"server": server})
        if check_secrets and not (server.debug or demo):
            _refuse_default_secrets(env, _switched_off_secrets(settings))
            _refuse_placeholders(env, settings)
        return settings


class SettingsReading(NamedTuple):
    settings: Settings
    problems: tuple[str, ...]


def field_default(spec: Field[Any]) -> Any:
    """The default of a settings field (its factory's value for a mutable one)."""
    return spec.default_factory() if callable(spec.default_factory) else spec.default


def _read_section(
    env: _Env, section: type[T], defaults: Mapping[str, Any], already_read: Mapping[str, Any] = MappingProxyType({})
) -> T:
    """Every field of `section` that has a variable, nested sections included; `defaults`
    replaces the field's default for the variables it names (demo, debug)."""
    hints = get_type_hints(section)
    values: dict[str, Any] = dict(already_read)
    for spec in fields(section):  # type: ignore[arg-type]
        kind = hints[spec.name]
        if spec.name in values:
            continue
        if _VARIABLE in spec.metadata:  # first: a derived value may be a dataclass (the catalogue)
            values[spec.name] = _read_variable(env, spec, kind, defaults, values)
        elif is_dataclass(kind):
            values[spec.name] = _read_section(env, kind, defaults)  # type: ignore[arg-type]
    return section(**values)


def _read_variable(
    env: _Env, spec: Field[Any], kind: Any, defaults: Mapping[str, Any], section: Mapping[str, Any]
) -> Any:
    var: Variable = spec.metadata[_VARIABLE]
    default = section[var.follows] if var.follows else field_default(spec)
    if var.read is not None:
        return var.read(env, default)
    assert var.name is not None
    default = defaults.get(var.name, default)
    if var.choices:
        value: Any = env.choice(var.name, default, var.choices)
    elif kind is bool:
        value = env.bool(var.name, default)
    elif kind is int:
        value = env.int(var.name, default, minimum=var.minimum)
    elif kind is float or kind == float | None:
        value = env.float(var.name, default, minimum=var.minimum)
    elif kind is str:
        value = env.str(var.name, default)
    elif kind == str | None:
        value = env.optional_str(var.name)
    elif kind == frozenset[str]:
        value = env.str_set(var.name, default)
    else:
        raise TypeError(f"{var.name}: no reader for a {kind} setting")
    return var.normalize(value) if var.normalize else value


def field_variable(spec: Field[Any]) -> Variable | None:
    """How a settings field is read and what it means; None for a field no variable sets."""
    return spec.metadata.get(_VARIABLE)


def _variables(section: type) -> Iterator[tuple[Field[Any], Variable]]:
    hints = get_type_hints(section)
    for spec in fields(section):
        if _VARIABLE in spec.metadata:
            yield spec, spec.metadata[_VARIABLE]
        elif is_dataclass(hints[spec.name]):
            yield from _variables(hints[spec.name])


def _secret_values(section: Any) -> Iterator[str]:
    for spec in fields(section):
        value = getattr(section, spec.name)
        if _VARIABLE in spec.metadata:
            if not spec.repr:  # `secret(...)` fields only
                yield value
        elif is_dataclass(value):
            yield from _secret_values(value)


# Secrets whose documented defaults must never reach production (compatibility.md D13).
DEFAULT_SECRETS: Mapping[str, str] = MappingProxyType(
    {
        var.name: spec.default
        for spec, var in _variables(Settings)
        if var.refused_default and var.name and isinstance(spec.default, str)
    }
)

# HS256 keys shorter than the hash output weaken the MAC (RFC 7518 §3.2).
_MIN_ACCESS_TOKEN_SECRET_BYTES = 32

# Setting the dev token to an empty value is how production turns the dev tiers off.
_EMPTY_ALLOWED = frozenset({"MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN"})


# A feature's own secret and the boolean variable that switches the feature on.
_SECRETS_OF_FEATURES: Mapping[str, str] = MappingProxyType(
    {var.name: var.refused_only_with for _, var in _variables(Settings) if var.refused_only_with and var.name}
)


def _switched_off_secrets(settings: Settings) -> frozenset[str]:
    """The secrets of features that are off: their defaults harm nobody."""
    switches = {var.name: getattr(section, spec.name) for section, spec, var in _fields_with_variables(settings)}
    return frozenset(name for name, switch in _SECRETS_OF_FEATURES.items() if not switches.get(switch))


def _fields_with_variables(section: Any) -> Iterator[tuple[Any, Field[Any], Variable]]:
    for spec in fields(section):
        value = getattr(section, spec.name)
        if _VARIABLE in spec.metadata:
            yield section, spec, spec.metadata[_VARIABLE]
        elif is_dataclass(value):
            yield from _fields_with_variables(value)


def _refuse_default_secrets(env: _Env, switched_off: frozenset[str] = frozenset()) -> None:
    """The secret rules (docs/operations.md, "Secrets"), every broken one reported."""
    for name, default in DEFAULT_SECRETS.items():
        if name in switched_off:
            continue
        value = env.raw(name)
        value = None if value is None else value.strip()
        if value is None or value == default or (value == "" and name not in _EMPTY_ALLOWED):
            state = "not set" if value is None else ("empty" if value == "" else "still the documented default")
            rule = f", at least {_MIN_ACCESS_TOKEN_SECRET_BYTES} bytes" if name == "MLPA_ACCESS_TOKEN_SECRET" else ""
            if name in _SECRETS_OF_FEATURES:
                rule += f" while {_SECRETS_OF_FEATURES[name]} is on"
            env.problem(
                f"{name}: {state}; set a real secret{rule} "
                "(defaults are accepted only with MLPA_DEBUG=true or in the demo)"
            )
        elif name == "MLPA_ACCESS_TOKEN_SECRET" and len(value.encode()) < _MIN_ACCESS_TOKEN_SECRET_BYTES:
            env.problem(
                f"MLPA_ACCESS_TOKEN_SECRET: must be at least {_MIN_ACCESS_TOKEN_SECRET_BYTES} bytes for HS256, got"
                f" {len(value.encode())} (the reference accepted shorter ones). A new secret invalidates every"
                " outstanding access token: Android clients get 401 once and re-run Play Integrity"
                " (docs/migration.md, 'The access-token secret')"
            )


# Values that can only fail requests later (compatibility.md D63): the reference's default team
# id, and the shipped ConfigMap's "replace-with-..." placeholders.
_TEAM_PLACEHOLDERS = frozenset({"TEAMID1234"})
_PLACEHOLDER_PREFIX = "replace-with-"
# Apple's team ids: ten upper-case letters and digits.
_TEAM_ID_LENGTH = 10
_OFF_HINT = "(defaults are accepted only with MLPA_DEBUG=true or in the demo)"


def _refuse_placeholders(env: _Env, settings: Settings) -> None:
    """The platform rules (docs/operations.md, "Platforms"): what iOS and Android clients need
    is set to something that can work, or the platform is turned off explicitly."""
    if settings.app_attest.enabled:
        team = env.raw("APP_DEVELOPMENT_TEAM")
        team = None if team is None else team.strip()
        if team is None or team == "":
            env.problem(f"APP_DEVELOPMENT_TEAM: {'not set' if team is None else 'empty'}; set your Apple team id,"
                        f" or APP_ATTEST_ENABLED=false to run without iOS clients {_OFF_HINT}")
        elif team in _TEAM_PLACEHOLDERS or team.startswith(_PLACEHOLDER_PREFIX):
            env.problem(f"APP_DEVELOPMENT_TEAM: still the placeholder {team!r}; set your Apple team id, or"
                        f" APP_ATTEST_ENABLED=false to run without iOS clients {_OFF_HINT}")
        elif len(team) != _TEAM_ID_LENGTH or not (team.isascii() and team.isalnum() and team.upper() == team):
            env.problem(f"APP_DEVELOPMENT_TEAM: {team!r} is not an Apple team id (ten upper-case letters and digits)")
        bundles = (env.raw("APP_ATTEST_BUNDLE_IDS") or "").strip()
        if bundles == "":
            env.problem("APP_ATTEST_BUNDLE_IDS: not set; list your iOS apps' bundle ids, or `*` for any (the"
                        f" reference's behaviour), or APP_ATTEST_ENABLED=false {_OFF_HINT}")
        elif any(name.startswith(_PLACEHOLDER_PREFIX) for name in settings.app_attest.bundle_ids):
            env.problem(f"APP_ATTEST_BUNDLE_IDS: still a placeholder ({bundles!r}); list your iOS apps' bundle ids")
    if settings.play.enabled:
        problem = _google_credentials_problem(env, settings.play.google_credentials)
        if problem is not None:
            env.problem(problem)


def _google_credentials_problem(env: _Env, credentials_file: str | None) -> str | None:
    """Why the Play Integrity calls could not get a Google token, found without a network call:
    the file named is unreadable, or Application Default Credentials have nothing to use."""
    if credentials_file is not None:
        return _credentials_file_problem("PLAY_INTEGRITY_CREDENTIALS_FILE", credentials_file)
    adc_file = (env.raw("GOOGLE_APPLICATION_CREDENTIALS") or "").strip()
    if adc_file:
        return _credentials_file_problem("GOOGLE_APPLICATION_CREDENTIALS", adc_file)
    if _gcloud_credentials_exist(env) or _on_google_cloud(env):
        return None
    return (
        "PLAY_INTEGRITY_CREDENTIALS_FILE: not set, and Application Default Credentials have nothing to use"
        " (GOOGLE_APPLICATION_CREDENTIALS unset, no gcloud credentials, not on Google Cloud); set one of the two"
        " to a service-account JSON file, or PLAY_INTEGRITY_ENABLED=false to run without Android clients"
    )


def _credentials_file_problem(name: str, path: str) -> str | None:
    try:
        with open(path, "rb") as file:
            content = json.load(file)
    except OSError as error:
        return f"{name}: cannot read {path!r}: {error.strerror or error}"
    except ValueError:
        return f"{name}: {path!r} is not JSON (a Google credentials file is)"
    if not isinstance(content, dict) or "type" not in content:
        return f"{name}: {path!r} is not a Google credentials file (no `type`)"
    return None


def _gcloud_credentials_exist(env: _Env) -> bool:
    """`gcloud auth application-default login`'s file, where google-auth looks for it."""
    config = (env.raw("CLOUDSDK_CONFIG") or "").strip()
    home = (env.raw("HOME") or "").strip()
    folder = config or (f"{home}/.config/gcloud" if home else "")
    return bool(folder) and os.path.isfile(f"{folder}/application_default_credentials.json")


# The machine's product name on Google Compute Engine (GKE nodes included).
_GCE_PRODUCT_NAME_FILE = "/sys/class/dmi/id/product_name"


def _on_google_cloud(env: _Env) -> bool:
    """A metadata server to ask (GKE workload identity, a VM's service account), as google-auth
    decides without a network call: its override variable, or Google's machine product name."""
    if (env.raw("GCE_METADATA_HOST") or "").strip():
        return True
    try:
        with open(_GCE_PRODUCT_NAME_FILE, encoding="utf-8") as file:
            return file.read().strip().startswith("Google")
    except OSError:
        return False


def variable_names() -> frozenset[str]:
    """Every environment variable the settings read (for docs and manifest checks)."""
    env = _Env({"MLPA_DEBUG": "true"})
    Settings._read(env, demo=False)
    return frozenset(env.names_read)
