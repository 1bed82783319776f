"""Configuration: one frozen dataclass per section, read once from an environ mapping.

`Settings.from_environ(os.environ)` is called by the entry points only; tests build
settings from a plain dict. Invalid values fail at startup with one `SettingsError` that
lists every problem found (each naming its variable), so one restart shows them all. Secrets are `repr=False`, so a logged settings object never shows them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Sequence, TypeVar

from .catalog import DEFAULT_BUDGETS, BudgetTier, ServiceType
from .settings_compat import with_reference_aliases
from .client_sockets import DeadPeerOptions

FXA_PRODUCTION_URL = "https://oauth.accounts.firefox.com/v1"
FXA_STAGE_URL = "https://api-accounts.stage.mozaws.net/v1"

# Secrets whose documented defaults must never reach production (decision 13).
DEFAULT_SECRETS: Mapping[str, str] = MappingProxyType(
    {
        "MASTER_KEY": "sk-default",
        "MLPA_VIRTUAL_KEY": "sk-virtual",
        "MLPA_UI_ACCESS_KEY": "sk-ui-access-default",
        "MLPA_ACCESS_TOKEN_SECRET": "mlpa-dev-secret",
        "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": "secret-dev-token",
    }
)

T = TypeVar("T")


class SettingsError(ValueError):
    """Configuration values are missing or invalid; `problems` has one line per variable."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: tuple[str, ...] = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class _Env:
    """Typed, case-insensitive reads from an environ mapping; errors name the variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        # The reference's renamed variables are read as their new names (settings_compat).
        self._values = with_reference_aliases({k.upper(): v for k, v in environ.items()})
        self.names_read: set[str] = set()
        # Every invalid value is recorded and replaced by its default, so that reading
        # goes on and one error can list them all (`Settings._read` raises it).
        self.problems: list[str] = []

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def raw(self, name: str) -> str | None:
        self.names_read.add(name)
        return self._values.get(name)

    def str(self, name: str, default: str) -> str:
        value = self.raw(name)
        return default if value is None else value.strip()

    def optional_str(self, name: str) -> str | None:
        value = (self.raw(name) or "").strip()
        return value or None

    def _parse(self, name: str, default: T, kind: str, parse: Callable[[str], T]) -> T:
        value = self.raw(name)
        if value is None or value.strip() == "":
            return default
        try:
            return parse(value.strip())
        except (ValueError, TypeError):
            self.problem(f"{name}: expected {kind}, got {value!r}")
            return default

    def bool(self, name: str, default: bool) -> bool:
        def parse(value: str) -> bool:
            lowered = value.lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError(value)

        return self._parse(name, default, "a boolean (true/false/1/0/yes/no/on/off)", parse)

    def int(self, name: str, default: int, *, minimum: int | None = None) -> int:
        value = self._parse(name, default, "an integer", int)
        if minimum is not None and value < minimum:
            self.problem(f"{name}: must be at least {minimum}, got {value}")
            return default
        return value

    def float(self, name: str, default: float, *, minimum: float | None = None) -> float:
        value = self._parse(name, default, "a number", float)
        if not math.isfinite(value):
            self.problem(f"{name}: must be a finite number, got {value}")
            return default
        if minimum is not None and value < minimum:
            self.problem(f"{name}: must be at least {minimum}, got {value}")
            return default
        return value

    def str_set(self, name: str, default: frozenset[str]) -> frozenset[str]:
        """A JSON list (the reference's format) or a comma-separated list."""

        def parse(value: str) -> frozenset[str]:
            if value.startswith("["):
                items = json.loads(value)
                if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                    raise ValueError(value)
            else:
                items = value.split(",")
            return frozenset(i.strip() for i in items if i.strip())

        return self._parse(name, default, "a JSON list of strings or a comma-separated list", parse)

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.str(name, default).lower()
        if value not in choices:
            self.problem(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
            return default
        return value


@dataclass(frozen=True, slots=True)
class ServerSettings:
    port: int = 8080
    debug: bool = False
    demo: bool = False
    log_json: bool = False
    log_level: str = "INFO"
    shutdown_drain_seconds: float = 20.0
    max_request_size_bytes: int = 3 * 1024 * 1024
    require_purpose_header: bool = False
    mock_routes: bool = False
    mock_ttft_ms: int = 200
    mock_streaming_chunk_latency_ms: int = 50
    security_headers_enabled: bool = True
    hsts_max_age: int = 31536000
    hsts_include_subdomains: bool = True
    keepalive_timeout_seconds: float = 75.0
    # Dead-peer detection on client connections (mlpa_aiohttp/client_sockets.py): a client
    # that vanished is noticed within max(idle, user timeout) + interval = 130 s by default.
    # Probes are answered by any live client's kernel, so a healthy slow client is never cut.
    client_keepalive_idle_seconds: float = 60.0
    client_keepalive_interval_seconds: float = 10.0
    client_keepalive_count: int = 6
    client_user_timeout_seconds: float = 120.0

    def dead_peer_options(self) -> DeadPeerOptions:
        return DeadPeerOptions(
            self.client_keepalive_idle_seconds,
            self.client_keepalive_interval_seconds,
            self.client_keepalive_count,
            self.client_user_timeout_seconds,
        )
    # Connections the kernel queues for accept() per listening socket. A burst of new
    # streams (a deploy, a reconnect storm) beyond it overflows the queue and clients wait
    # on SYN retransmits (1, 3, 7 s). The kernel caps it at net.core.somaxconn (4096 by
    # default since Linux 5.4): see docs/performance.md, "Admission".
    listen_backlog: int = 4096


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """LiteLLM and how we talk to it (one shared aiohttp ClientSession)."""

    api_base: str = "http://localhost:4000"
    virtual_key: str = field(default="sk-virtual", repr=False)
    master_key: str = field(default="sk-default", repr=False)
    streaming_timeout_seconds: float = 300.0
    read_timeout_seconds: float = 300.0
    connect_timeout_seconds: float = 10.0
    max_connections: int = 20000
    keepalive_timeout_seconds: float = 4.0
    admin_timeout_seconds: float = 30.0
    search_timeout_seconds: float = 30.0
    # Beyond the reference: transient completion failures retried before the first byte
    # (0 attempts = off; docs/keepalive-and-retries.md says why off by default).
    retry_attempts: int = 0
    retry_backoff_seconds: float = 0.25
    retry_budget_seconds: float = 3.0

    def url(self, path: str) -> str:
        return self.api_base.rstrip("/") + path


@dataclass(frozen=True, slots=True)
class CompletionDefaults:
    temperature: float = 0.1
    top_p: float = 0.01
    max_completion_tokens: int = 8192


@dataclass(frozen=True, slots=True)
class FxASettings:
    base_url: str = FXA_PRODUCTION_URL
    scopes: tuple[str, ...] = ("profile:uid",)
    client_id: str = "default-client-id"
    client_secret: str = field(default="default-client-secret", repr=False)
    verify_cache_seconds: float = 300.0
    jwks_cache_seconds: float = 600.0
    request_timeout_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class AuthSettings:
    experimentation_token: str = field(default="", repr=False)
    ui_access_key: str = field(default="sk-ui-access-default", repr=False)
    access_token_secret: str = field(default="mlpa-dev-secret", repr=False)
    access_token_ttl_seconds: int = 86400


@dataclass(frozen=True, slots=True)
class SignupCapSettings:
    enforce: bool = False
    max_signed_in_users: int = 1_000_000
    capped_service_types: frozenset[ServiceType] = frozenset({ServiceType.AI, ServiceType.MEMORIES})
    admission_lock_timeout_ms: int = 5000


@dataclass(frozen=True, slots=True)
class PostgresSettings:
    host: str = "localhost"
    port: int = 5432
    username: str = "litellm"
    password: str = field(default="litellm", repr=False)
    litellm_db_name: str = "litellm"
    app_attest_db_name: str = "app_attest"
    pool_min_size: int = 1
    pool_max_size: int = 10
    prepared_stmt_cache_max_size: int = 100
    readiness_check_timeout_s: float = 2.0
    statement_timeout_ms: int = 3000
    idle_in_tx_timeout_ms: int = 10000
    maintenance_statement_timeout_ms: int = 30000
    admin_read_timeout_ms: int = 15000
    command_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class AppAttestSettings:
    development_team: str = "TEAMID1234"
    production: bool = False
    challenge_expiry_seconds: int = 300
    qa: bool = False
    root_ca_path: str | None = None
    qa_root_ca_path: str | None = None
    bundle_ids: frozenset[str] = frozenset()
    # Apple's assertion step 5 (app id hash); false only while clients transition.
    check_assertion_app_id: bool = True


@dataclass(frozen=True, slots=True)
class PlaySettings:
    package_name: str = "org.mozilla.firefox"
    allowed_package_names: frozenset[str] = frozenset(
        {"org.mozilla.fenix", "org.mozilla.fenix.debug", "org.mozilla.firefox", "org.mozilla.firefox_beta"}
    )
    api_base: str = "https://playintegrity.googleapis.com"
    request_timeout_seconds: float = 30.0
    quota_project: str | None = None
    max_age_seconds: int = 300
    # A service-account JSON file; None means Application Default Credentials.
    google_credentials: str | None = None


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    sentry_dsn: str = field(default="", repr=False)
    prometheus_multiproc_dir: str | None = None


@dataclass(frozen=True, slots=True)
class StreamLimitSettings:
    """Beyond the reference: open streams one identity may hold per worker (0 = no cap)."""

    max_concurrent_streams_per_user: int = 0
    # Beyond the reference: `: keep-alive` comments every this many seconds while a stream
    # waits for its first upstream byte (0 = off), for these service types or on request.
    keepalive_seconds: float = 0.0
    keepalive_service_types: frozenset[str] = frozenset()
    # Relay from the upstream connection's callbacks (relay/fast_path.py); off: the regular relay.
    relay_fast_path: bool = False


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    completion: CompletionDefaults = CompletionDefaults()
    fxa: FxASettings = FxASettings()
    auth: AuthSettings = AuthSettings()
    budgets: Mapping[ServiceType, BudgetTier] = field(default_factory=lambda: DEFAULT_BUDGETS)
    signup_cap: SignupCapSettings = SignupCapSettings()
    store: str = "postgres"
    postgres: PostgresSettings = PostgresSettings()
    app_attest: AppAttestSettings = AppAttestSettings()
    play: PlaySettings = PlaySettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    stream_limits: StreamLimitSettings = StreamLimitSettings()

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], *, demo: bool = False, check_secrets: bool = True
    ) -> "Settings":
        """`check_secrets=False` is for commands that use no secret but the database's
        (`migrate`), so a migration job need not carry the service's keys."""
        return cls._read(_Env(environ), demo=demo, check_secrets=check_secrets)

    @classmethod
    def _read(cls, env: _Env, *, demo: bool, check_secrets: bool = True) -> "Settings":
        debug = env.bool("MLPA_DEBUG", False)
        settings = cls(
            server=_server(env, debug=debug, demo=demo),
            upstream=_upstream(env),
            completion=CompletionDefaults(
                temperature=env.float("TEMPERATURE", 0.1),
                top_p=env.float("TOP_P", 0.01),
                max_completion_tokens=env.int("MAX_COMPLETION_TOKENS", 8192, minimum=1),
            ),
            fxa=_fxa(env, debug=debug),
            auth=AuthSettings(
                experimentation_token=env.str("MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN", "secret-dev-token"),
                ui_access_key=env.str("MLPA_UI_ACCESS_KEY", "sk-ui-access-default"),
                access_token_secret=env.str("MLPA_ACCESS_TOKEN_SECRET", "mlpa-dev-secret"),
                access_token_ttl_seconds=env.int("MLPA_ACCESS_TOKEN_TTL_SECONDS", 86400, minimum=1),
            ),
            budgets=_budgets(env),
            signup_cap=_signup_cap(env),
            store=env.choice("MLPA_STORE", "memory" if demo else "postgres", ("postgres", "memory")),
            postgres=_postgres(env),
            app_attest=AppAttestSettings(
                development_team=env.str("APP_DEVELOPMENT_TEAM", "TEAMID1234"),
                production=env.bool("APP_ATTEST_PRODUCTION", False),
                challenge_expiry_seconds=env.int("CHALLENGE_EXPIRY_SECONDS", 300, minimum=1),
                qa=env.bool("APP_ATTEST_QA", False),
                root_ca_path=env.optional_str("APP_ATTEST_ROOT_CA_PATH"),
                qa_root_ca_path=env.optional_str("APP_ATTEST_QA_ROOT_CA_PATH"),
                bundle_ids=env.str_set("APP_ATTEST_BUNDLE_IDS", frozenset()),
                check_assertion_app_id=env.bool("APP_ATTEST_CHECK_ASSERTION_APP_ID", True),
            ),
            play=PlaySettings(
                package_name=env.str("PLAY_INTEGRITY_PACKAGE_NAME", "org.mozilla.firefox"),
                allowed_package_names=env.str_set("ALLOWED_PACKAGE_NAMES", PlaySettings().allowed_package_names),
                api_base=env.str("PLAY_INTEGRITY_API_BASE", "https://playintegrity.googleapis.com"),
                request_timeout_seconds=env.float("PLAY_INTEGRITY_REQUEST_TIMEOUT_SECONDS", 30.0, minimum=0.001),
                quota_project=env.optional_str("PLAY_INTEGRITY_QUOTA_PROJECT"),
                max_age_seconds=env.int("PLAY_INTEGRITY_MAX_AGE_SECONDS", 300, minimum=1),
                google_credentials=env.optional_str("PLAY_INTEGRITY_CREDENTIALS_FILE"),
            ),
            observability=ObservabilitySettings(
                sentry_dsn=env.str("SENTRY_DSN", ""),
                prometheus_multiproc_dir=env.optional_str("PROMETHEUS_MULTIPROC_DIR"),
            ),
            stream_limits=StreamLimitSettings(
                max_concurrent_streams_per_user=env.int("MAX_CONCURRENT_STREAMS_PER_USER", 0, minimum=0),
                keepalive_seconds=env.float("STREAM_KEEPALIVE_SECONDS", 0.0, minimum=0.0),
                keepalive_service_types=env.str_set("STREAM_KEEPALIVE_SERVICE_TYPES", frozenset()),
                relay_fast_path=env.bool("RELAY_FAST_PATH", False),
            ),
        )
        if check_secrets and not (debug or demo):
            _refuse_default_secrets(env)
        if env.problems:
            raise SettingsError(env.problems)
        return settings


def _server(env: _Env, *, debug: bool, demo: bool) -> ServerSettings:
    return ServerSettings(
        port=env.int("PORT", 8080, minimum=0),
        debug=debug,
        demo=demo,
        log_json=env.bool("LOG_JSON", False),
        log_level=env.choice("LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")).upper(),
        shutdown_drain_seconds=env.float("SHUTDOWN_DRAIN_SECONDS", 20.0, minimum=0.0),
        max_request_size_bytes=env.int("MAX_REQUEST_SIZE_BYTES", 3 * 1024 * 1024, minimum=1),
        require_purpose_header=env.bool("MLPA_REQUIRE_PURPOSE_HEADER", False),
        mock_routes=env.bool("MLPA_MOCK_ROUTES", demo),
        mock_ttft_ms=env.int("MOCK_TTFT_MS", 200, minimum=0),
        mock_streaming_chunk_latency_ms=env.int("MOCK_STREAMING_CHUNK_LATENCY_MS", 50, minimum=0),
        security_headers_enabled=env.bool("SECURITY_HEADERS_ENABLED", True),
        hsts_max_age=env.int("HSTS_MAX_AGE", 31536000, minimum=0),
        hsts_include_subdomains=env.bool("HSTS_INCLUDE_SUBDOMAINS", True),
        keepalive_timeout_seconds=env.float("KEEPALIVE_TIMEOUT_SECONDS", 75.0, minimum=0.0),
        client_keepalive_idle_seconds=env.float("CLIENT_KEEPALIVE_IDLE_SECONDS", 60.0, minimum=1.0),
        client_keepalive_interval_seconds=env.float("CLIENT_KEEPALIVE_INTERVAL_SECONDS", 10.0, minimum=1.0),
        client_keepalive_count=env.int("CLIENT_KEEPALIVE_COUNT", 6, minimum=1),
        client_user_timeout_seconds=env.float("CLIENT_USER_TIMEOUT_SECONDS", 120.0, minimum=0.0),
        listen_backlog=env.int("LISTEN_BACKLOG", 4096, minimum=1),
    )


def _upstream(env: _Env) -> UpstreamSettings:
    streaming = env.float("STREAMING_TIMEOUT_SECONDS", 300.0, minimum=0.001)
    return UpstreamSettings(
        api_base=env.str("LITELLM_API_BASE", "http://localhost:4000").rstrip("/"),
        virtual_key=env.str("MLPA_VIRTUAL_KEY", "sk-virtual"),
        master_key=env.str("MASTER_KEY", "sk-default"),
        streaming_timeout_seconds=streaming,
        # Decision 4: the non-streaming read timeout defaults to the streaming one.
        read_timeout_seconds=env.float("UPSTREAM_READ_TIMEOUT_SECONDS", streaming, minimum=0.001),
        connect_timeout_seconds=env.float("UPSTREAM_CONNECT_TIMEOUT_SECONDS", 10.0, minimum=0.001),
        max_connections=env.int("UPSTREAM_MAX_CONNECTIONS", 20000, minimum=0),
        keepalive_timeout_seconds=env.float("UPSTREAM_KEEPALIVE_TIMEOUT_SECONDS", 4.0, minimum=0.0),
        retry_attempts=env.int("UPSTREAM_RETRY_ATTEMPTS", 0, minimum=0),
        retry_backoff_seconds=env.float("UPSTREAM_RETRY_BACKOFF_SECONDS", 0.25, minimum=0.0),
        retry_budget_seconds=env.float("UPSTREAM_RETRY_BUDGET_SECONDS", 3.0, minimum=0.0),
    )


def _fxa(env: _Env, *, debug: bool) -> FxASettings:
    extra = [env.str(f"ADDITIONAL_FXA_SCOPE_{i}", "") for i in (1, 2, 3)]
    scopes = ("profile:uid", *(s for s in extra if s and s != "profile:uid"))
    return FxASettings(
        base_url=env.str("FXA_BASE_URL", FXA_STAGE_URL if debug else FXA_PRODUCTION_URL).rstrip("/"),
        scopes=tuple(dict.fromkeys(scopes)),
        client_id=env.str("CLIENT_ID", "default-client-id"),
        client_secret=env.str("CLIENT_SECRET", "default-client-secret"),
        verify_cache_seconds=env.float("FXA_VERIFY_CACHE_SECONDS", 300.0, minimum=0.0),
        jwks_cache_seconds=env.float("FXA_JWKS_CACHE_SECONDS", 600.0, minimum=0.0),
        request_timeout_seconds=env.float("FXA_REQUEST_TIMEOUT_SECONDS", 10.0, minimum=0.001),
    )


def _budgets(env: _Env) -> Mapping[ServiceType, BudgetTier]:
    tiers = {}
    for st, default in DEFAULT_BUDGETS.items():
        prefix = f"USER_FEATURE_BUDGET_{st.env_name}_"
        tiers[st] = BudgetTier(
            budget_id=env.str(prefix + "BUDGET_ID", default.budget_id),
            max_budget=env.float(prefix + "MAX_BUDGET", default.max_budget, minimum=0.0),
            rpm_limit=env.int(prefix + "RPM_LIMIT", default.rpm_limit, minimum=0),
            tpm_limit=env.int(prefix + "TPM_LIMIT", default.tpm_limit, minimum=0),
            budget_duration=env.str(prefix + "BUDGET_DURATION", default.budget_duration),
        )
    return MappingProxyType(tiers)


def _signup_cap(env: _Env) -> SignupCapSettings:
    names = env.str_set("MLPA_CAPPED_SERVICE_TYPES", frozenset({"ai", "memories"}))
    capped = set()
    for name in names:
        st = ServiceType.parse(name)
        if st is None:
            env.problem(f"MLPA_CAPPED_SERVICE_TYPES: unknown service type {name!r}")
            continue
        capped.add(st)
    return SignupCapSettings(
        enforce=env.bool("MLPA_ENFORCE_SIGNIN_CAP", False),
        max_signed_in_users=env.int("MLPA_MAX_SIGNED_IN_USERS", 1_000_000, minimum=0),
        capped_service_types=frozenset(capped),
        admission_lock_timeout_ms=env.int("MLPA_ADMISSION_LOCK_TIMEOUT_MS", 5000, minimum=1),
    )


def _postgres(env: _Env) -> PostgresSettings:
    command_timeout = env.float("PG_COMMAND_TIMEOUT_S", 0.0, minimum=0.0)
    return PostgresSettings(
        host=env.str("DB_HOST", "localhost"),
        port=env.int("DB_PORT", 5432, minimum=1),
        username=env.str("DB_USERNAME", "litellm"),
        password=env.str("DB_PASSWORD", "litellm"),
        litellm_db_name=env.str("LITELLM_DB_NAME", "litellm"),
        app_attest_db_name=env.str("APP_ATTEST_DB_NAME", "app_attest"),
        pool_min_size=env.int("PG_POOL_MIN_SIZE", 1, minimum=0),
        pool_max_size=env.int("PG_POOL_MAX_SIZE", 10, minimum=1),
        prepared_stmt_cache_max_size=env.int("PG_PREPARED_STMT_CACHE_MAX_SIZE", 100, minimum=0),
        readiness_check_timeout_s=env.float("READINESS_CHECK_TIMEOUT_S", 2.0, minimum=0.001),
        statement_timeout_ms=env.int("PG_STATEMENT_TIMEOUT_MS", 3000, minimum=0),
        idle_in_tx_timeout_ms=env.int("PG_IDLE_IN_TX_TIMEOUT_MS", 10000, minimum=0),
        maintenance_statement_timeout_ms=env.int("PG_MAINTENANCE_STATEMENT_TIMEOUT_MS", 30000, minimum=0),
        admin_read_timeout_ms=env.int("PG_ADMIN_READ_TIMEOUT_MS", 15000, minimum=0),
        command_timeout_s=command_timeout or None,
    )


# HS256 keys shorter than the hash output weaken the MAC (RFC 7518 §3.2).
_MIN_ACCESS_TOKEN_SECRET_BYTES = 32

# Setting the dev token to an empty value is how production turns the dev tiers off.
_EMPTY_ALLOWED = frozenset({"MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN"})


def _refuse_default_secrets(env: _Env) -> None:
    """The secret rules (README "Secrets"), every broken one reported."""
    for name, default in DEFAULT_SECRETS.items():
        value = env.raw(name)
        value = None if value is None else value.strip()
        if value is None or value == default or (value == "" and name not in _EMPTY_ALLOWED):
            state = "not set" if value is None else ("empty" if value == "" else "still the documented default")
            rule = f", at least {_MIN_ACCESS_TOKEN_SECRET_BYTES} bytes" if name == "MLPA_ACCESS_TOKEN_SECRET" else ""
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


def variable_names() -> frozenset[str]:
    """Every environment variable the settings read (for docs and manifest checks)."""
    env = _Env({"MLPA_DEBUG": "true"})
    Settings._read(env, demo=False)
    return frozenset(env.names_read)
