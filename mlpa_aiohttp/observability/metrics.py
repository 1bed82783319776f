"""Prometheus metrics of compatibility.md §6, on a registry owned by the app (no global registry).

Under gunicorn with several workers, `PROMETHEUS_MULTIPROC_DIR` makes prometheus-client
write values to per-process files, and `/metrics` aggregates them (compatibility.md D19).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import multiprocess

from ..catalog import BUILTIN_CATALOG, Catalog
from .exa_errors import exa_error_labels
from .known_series import KnownLabels, known, known_rows
from .labels import (
    BUDGET_LINK_REPAIR_SITES,
    BUDGET_ROW_REPAIR_SITES,
    DEFAULT_LAUNCH_COUNTRIES,
    SHED_REASONS,
    LabelBounds,
)
from .runtime_metrics import GCPauses, WorkerGCCounters, register_multiprocess, register_single_process

REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
FAST_AUTH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
AUTH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
FXA_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
COMPLETION_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180)
SEARCH_BUCKETS = (0.1, 0.2, 0.5, 1, 2.5, 5, 10, 20)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
TOOL_CALL_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50)
TOKEN_BUCKETS = (0, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000)
ATTEMPT_BUCKETS = (0, 1, 2, 3, 5)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# Availability outcome is a pure function of the reason (compatibility.md §6).
AVAILABILITY_OUTCOME: Mapping[str, str] = {
    "auth_rejected": "excluded",
    "invalid_auth_request": "excluded",
    "invalid_service_type_for_model": "excluded",
    "invalid_model_name": "excluded",
    "signup_cap_exceeded": "excluded",
    "blocked": "excluded",
    "provisioning_failure": "failure",
    "auth_system_failure": "failure",
    "valid_response": "success",
    "upstream_error": "failure",
    "empty_response": "failure",
    "budget_exceeded": "excluded",
    "rate_limited_platform": "excluded",
    "rate_limited_upstream": "excluded",
    "payload_too_large": "excluded",
    "invalid_request": "excluded",
    "client_disconnect": "abort",
    # Ours: a stream ended by a deploy's drain deadline is not the service failing users.
    "server_shutdown": "excluded",
    # Ours: MAX_CONCURRENT_STREAMS_PER_USER turned a caller away, a policy like a rate limit.
    "concurrent_stream_limit": "excluded",
    # The reference's code 10 (1.0.39): the service's own budget is spent, users are failed.
    "global_budget_exceeded": "failure",
    # Ours: enforced traffic contracts (TRAFFIC_CONTRACT_REJECT_OVER_CONTRACT) refused it, a policy too.
    "traffic_contract_exceeded": "excluded",
}


class _RememberedChildren:
    """`labels()` answered from a dict keyed by the values as given. prometheus-client's own
    builds a tuple of `str()` of every value and takes a lock on each call, several times per
    request (3 % of a new stream's instructions, callgrind). The children are the client's
    own, so exposition and the multiprocess files are unchanged; cardinality is bounded
    before this (labels.py). Removing children forgets them here too.

    `known`: the label values known before the first event, whose series are made now, at
    zero (known_series.py)."""

    def __init__(self, *args: Any, known: KnownLabels | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._remembered: dict[tuple[Any, ...], Any] = {}
        self.known_labels = known
        if known is not None:
            for values in known.label_sets(self._labelnames):  # type: ignore[attr-defined]
                self.labels(*values)

    def labels(self, *values: Any, **by_name: Any) -> Any:
        if by_name:
            return super().labels(*values, **by_name)  # type: ignore[misc]
        child = self._remembered.get(values)
        if child is None:
            child = self._remembered[values] = super().labels(*values)  # type: ignore[misc]
        return child

    def remove(self, *values: Any) -> None:
        self._remembered.clear()
        super().remove(*values)  # type: ignore[misc]

    def clear(self) -> None:
        self._remembered.clear()
        super().clear()  # type: ignore[misc]


class Counter(_RememberedChildren, prometheus_client.Counter):
    pass


class Gauge(_RememberedChildren, prometheus_client.Gauge):
    pass


class Histogram(_RememberedChildren, prometheus_client.Histogram):
    pass


_CHAT = ("model", "service_type", "purpose")
_ROUTED = ("requested_model", "backend", "service_type", "purpose")


class Metrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        multiprocess: bool = False,
        catalog: Catalog = BUILTIN_CATALOG,
        launch_countries: frozenset[str] = DEFAULT_LAUNCH_COUNTRIES,
    ) -> None:
        """`multiprocess`: several workers share `PROMETHEUS_MULTIPROC_DIR`; the process and
        GC series are then per worker (observability/runtime_metrics.py). `catalog` bounds
        the service-type, purpose and model labels (`labels`), `launch_countries` the
        by-country chat metrics' `client_country` (MLPA_LAUNCH_COUNTRIES).

        A labelled metric that an alert or an autoscaler reads declares the label values it
        knows up front with `known=` (known_series.py), so its series exist at 0 from start;
        tests/e2e/test_series_from_start.py fails for one that does not."""
        self.registry = registry
        self.labels = LabelBounds(catalog, launch_countries)
        # Installed in gc.callbacks for the app's life (app.py, `_worker_gc_metrics_context`).
        self.gc_pauses = GCPauses()
        self.gc_counters = WorkerGCCounters(self.gc_pauses) if multiprocess else None
        # Exposed whenever this registry is (without a multiprocess directory).
        register_single_process(registry)
        registry.register(self.gc_pauses)
        r = registry
        b = self.labels
        self.in_progress = Gauge(
            "mlpa_in_progress_requests", "Requests in progress", registry=r, multiprocess_mode="livesum"
        )
        self.open_streams = Gauge(
            "mlpa_open_streams", "Streaming completions being relayed", registry=r, multiprocess_mode="livesum"
        )
        # Signup capacity (compatibility.md §3.2), read from the store at scrape time; every worker
        # reads the same row, so the most recent value is the value.
        self.signup_capacity_max = Gauge(
            "mlpa_signup_capacity_max_identities",
            "Managed identities the signup cap allows",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.signup_capacity_current = Gauge(
            "mlpa_signup_capacity_current_identities",
            "Managed identities admitted",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.signup_cap_enforced = Gauge(
            "mlpa_signup_cap_enforced", "1 when the signup cap is enforced", registry=r, multiprocess_mode="mostrecent"
        )
        # LiteLLM's budget state repaired (store/budget_links.py); `at`: start, admission,
        # request, budget_change. Any count means a tier's budget row had been deleted.
        self.budget_rows_restored = Counter(
            "mlpa_budget_rows_restored",
            "Service types' budget rows written again after LiteLLM's foreign key found them missing",
            ("service_type", "at"),
            registry=r,
            known=known(service_type=b.service_types, at=BUDGET_ROW_REPAIR_SITES),
        )
        self.budget_links_restored = Counter(
            "mlpa_budget_links_restored",
            "End users whose unset budget (its row had been deleted) was set back to their service type's",
            ("service_type", "at"),
            registry=r,
            known=known(service_type=b.service_types, at=BUDGET_LINK_REPAIR_SITES),
        )
        self.relayed_bytes = Counter("mlpa_relayed_bytes", "Bytes relayed from LiteLLM to clients", registry=r)
        self.upstream_retries = Counter(
            "mlpa_upstream_retries",
            "Requests re-sent to LiteLLM after a transient failure before any response byte",
            ("reason",),
            registry=r,
        )
        self.stream_keepalives = Counter(
            "mlpa_stream_keepalive_comments", "SSE keep-alive empty lines sent while a first token was pending", registry=r
        )
        # Overload protection (mlpa_aiohttp/process/overload.py), observed only while it is on;
        # each shed reason's series exists from start, so the overlay's HPA reads 0, not nothing.
        self.shed_requests = Counter(
            "mlpa_shed_requests", "New requests shed by overload protection", ("reason",), registry=r,
            known=known(reason=SHED_REASONS),
        )
        self.overloaded = Gauge(
            "mlpa_overloaded", "1 while this worker reports itself overloaded", registry=r, multiprocess_mode="livesum"
        )
        # The worker's Redis link (fleet/redis_link.py), only while a feature uses Redis.
        self.redis_up = Gauge(
            "mlpa_redis_up",
            "1 while this worker's Redis link is healthy, 0 from a failure to the next success",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.redis_failures = Counter(
            "mlpa_redis_failures",
            "Redis calls that failed or were skipped while backing off, by operation and kind",
            ("operation", "kind"),
            registry=r,
        )
        # The fleet-wide stream cap (fleet/stream_cap.py), only with STREAM_CAP_SCOPE=fleet.
        self.stream_cap_scope = Gauge(
            "mlpa_stream_cap_scope",
            "Workers whose MAX_CONCURRENT_STREAMS_PER_USER counts at this scope right now: fleet, or worker"
            " while falling back (Redis unavailable, slow or just restarted)",
            ("scope",),
            registry=r,
            multiprocess_mode="livesum",
        )
        self.stream_cap_fallbacks = Counter(
            "mlpa_stream_cap_fallbacks",
            "Streams admitted by the per-worker count alone because Redis did not answer, by failure kind",
            ("kind",),
            registry=r,
        )
        self.stream_leases_restored = Counter(
            "mlpa_stream_leases_restored",
            "Live stream leases a renewal found missing from Redis and re-added (a Redis restart)",
            registry=r,
        )
        self.event_loop_lag = Histogram(
            "mlpa_event_loop_lag_seconds", "Event-loop lag, sampled", buckets=LAG_BUCKETS, registry=r
        )
        self.requests = Counter(
            "mlpa_requests",
            "Requests",
            (
                "method", "endpoint", "service_type", "purpose", "major_fx_version",
                "traffic_contract_rpm_mode", "traffic_contract_tpm_mode",
            ),
            registry=r,
        )  # fmt: skip
        self.requests_by_country = Counter(
            "mlpa_requests_by_country", "Requests by country", ("service_type", "model", "client_country"), registry=r
        )
        self.bad_http_requests = Counter(
            "mlpa_bad_http_requests", "Requests aiohttp's HTTP parser refused with a 4xx", ("reason",), registry=r
        )
        self.status_codes = Counter("mlpa_response_status_codes", "Responses by status", ("status_code",), registry=r)
        self.request_latency = Histogram(
            "mlpa_request_latency_seconds", "Request latency", ("method", "endpoint"), buckets=REQUEST_BUCKETS, registry=r
        )
        self.challenge_latency = Histogram(
            "mlpa_validate_challenge_latency_seconds", "Challenge validation", ("result",), buckets=FAST_AUTH_BUCKETS, registry=r
        )
        self.app_attest_latency = Histogram(
            "mlpa_validate_app_attest_latency_seconds", "Attestation verification", ("result",), buckets=AUTH_BUCKETS, registry=r
        )
        self.app_assert_latency = Histogram(
            "mlpa_validate_app_assert_latency_seconds", "Assertion verification", ("result",), buckets=AUTH_BUCKETS, registry=r
        )
        self.fxa_latency = Histogram(
            "mlpa_validate_fxa_latency_seconds",
            "FxA verification",
            ("result", "verification_source"),
            buckets=FXA_BUCKETS,
            registry=r,
        )
        self.play_latency = Histogram(
            "mlpa_validate_play_latency_seconds", "Play Integrity verification", ("result",), buckets=AUTH_BUCKETS, registry=r
        )
        self.access_token_latency = Histogram(
            "mlpa_validate_access_token_latency_seconds", "Access token check", ("result",), buckets=AUTH_BUCKETS, registry=r
        )
        self.fxa_verifications = Counter(
            "mlpa_fxa_verifications", "Successful FxA verifications", ("verification_source",), registry=r
        )
        self.play_verifications = Counter("mlpa_play_verifications", "Successful Play verifications", registry=r)
        self.access_token_verifications = Counter(
            "mlpa_access_token_verifications", "Successful access token checks", registry=r
        )
        self.completion_latency = Histogram(
            "mlpa_chat_completion_latency_seconds",
            "Completion latency",
            ("result", *_CHAT),
            buckets=COMPLETION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "mlpa_chat_completion_ttft_seconds", "Time to first upstream chunk", ("model",), buckets=TTFT_BUCKETS, registry=r,
            known=known(model=b.models),
        )
        self.tokens = Counter("mlpa_chat_tokens", "Tokens", ("type", *_CHAT), registry=r)
        # Ours: what streams the client left mid-way had been sent, counted from the usage
        # object when one arrived (kind="usage"), else from the content deltas relayed
        # (kind="content_deltas", completion only). A metric of its own so `mlpa_chat_tokens`
        # keeps the reference's series.
        self.aborted_stream_tokens = Counter(
            "mlpa_aborted_stream_tokens", "Tokens relayed to streams the client left", ("type", *_CHAT, "kind"), registry=r
        )
        self.tokens_per_request = Histogram(
            "mlpa_chat_tokens_per_request", "Tokens per request", ("type", *_CHAT), buckets=TOKEN_BUCKETS, registry=r
        )
        self.tool_calls = Counter("mlpa_chat_tool_calls", "Tool calls", _CHAT, registry=r)
        self.completions_with_tools = Counter(
            "mlpa_chat_completions_with_tools", "Completions with tool calls", _CHAT, registry=r
        )
        self.tool_calls_per_completion = Histogram(
            "mlpa_chat_tool_calls_per_completion", "Tool calls per completion", _CHAT, buckets=TOOL_CALL_BUCKETS, registry=r
        )
        self.requests_with_tools = Counter(
            "mlpa_chat_requests_with_tools", "Requests offering tools", _CHAT, registry=r
        )
        self.chat_rejections = Counter(
            "mlpa_chat_request_rejections", "Rejected chat requests", ("reason", *_CHAT), registry=r
        )
        self.availability = Counter(
            "mlpa_chat_availability", "Chat availability samples", ("outcome", "reason", *_CHAT), registry=r,
            known=known_rows([{"outcome": outcome, "reason": reason} for reason, outcome in AVAILABILITY_OUTCOME.items()]),
        )
        self.search_latency = Histogram(
            "mlpa_search_latency_seconds", "Search latency", ("result",), buckets=SEARCH_BUCKETS, registry=r
        )
        self.search_rejections = Counter(
            "mlpa_search_request_rejections", "Rejected searches", ("reason", *_CHAT), registry=r
        )
        # MLPA 1.0.39's launch-market twins: recorded with every sample of their parents
        # (`chat_completion_latency`, `chat_ttft`, `chat_availability`), never instead.
        self.completion_latency_by_country = Histogram(
            "mlpa_chat_completion_latency_by_country_seconds",
            "Completion latency by launch country",
            ("result", "client_country", "service_type"),
            buckets=COMPLETION_BUCKETS,
            registry=r,
        )
        self.ttft_by_country = Histogram(
            "mlpa_chat_completion_ttft_by_country_seconds",
            "Time to first upstream chunk by launch country",
            ("client_country", "service_type"),
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.availability_by_country = Counter(
            "mlpa_chat_availability_by_country",
            "Chat availability samples by launch country",
            ("outcome", "client_country", "service_type"),
            registry=r,
        )
        # Errors LiteLLM answered for an Exa-backed model (observability/exa_errors.py).
        self.exa_errors = Counter(
            "mlpa_exa_errors",
            "Upstream errors of the Exa-backed models, by status and Exa's error tag",
            ("model", "status_code", "tag"),
            registry=r,
        )
        self.routed_completions = Counter(
            "mlpa_litellm_routed_completions", "Completions by LiteLLM route", (*_ROUTED, "fallback_used"), registry=r
        )
        self.attempted_fallbacks = Histogram(
            "mlpa_litellm_attempted_fallbacks", "LiteLLM fallbacks", _ROUTED, buckets=ATTEMPT_BUCKETS, registry=r
        )
        self.attempted_retries = Histogram(
            "mlpa_litellm_attempted_retries", "LiteLLM retries", _ROUTED, buckets=ATTEMPT_BUCKETS, registry=r
        )
        self.reported_duration = Histogram(
            "mlpa_litellm_reported_duration_seconds",
            "LiteLLM-reported duration",
            (*_ROUTED, "fallback_used"),
            buckets=COMPLETION_BUCKETS,
            registry=r,
        )
        self.reported_cost = Counter(
            "mlpa_litellm_reported_cost_usd", "LiteLLM-reported cost", (*_ROUTED, "fallback_used"), registry=r
        )
        self.routed_tokens = Counter(
            "mlpa_litellm_routed_tokens", "Tokens by LiteLLM route", ("type", *_ROUTED, "fallback_used"), registry=r
        )
        # What the last readiness check saw of each shared backend (compatibility.md D64): with
        # readiness on the pod's own health, this is where a dependency outage shows.
        self.dependency_up = Gauge(
            "mlpa_dependency_up",
            "1 when the last readiness check reached the dependency (postgres, app_attest, litellm, privacy_filter)",
            ("dependency",),
            registry=r,
            multiprocess_mode="mostrecent",
        )

    # -- helpers used at the recording sites -----------------------------------------
    def chat_availability(
        self, reason: str, *, model: str | None, service_type: str, purpose: str, country: str | None
    ) -> None:
        """One availability sample and its by-country twin; `country` is the raw
        `X-Geo-Country` value (None when absent)."""
        outcome, service_type_label = AVAILABILITY_OUTCOME[reason], self.labels.service_type(service_type)
        self.availability.labels(
            outcome, reason, self.labels.model(model), service_type_label, self.labels.purpose(purpose)
        ).inc()
        self.availability_by_country.labels(outcome, self.labels.launch_country(country), service_type_label).inc()

    def chat_completion_latency(
        self, result: str, seconds: float, *, model_label: str, service_type: str, purpose: str, country: str | None
    ) -> None:
        """A completion's latency and its by-country twin. `model_label` as the site chose it
        (the raw model on success, the clamp otherwise)."""
        self.completion_latency.labels(result, model_label, service_type, purpose).observe(seconds)
        self.completion_latency_by_country.labels(
            result, self.labels.launch_country(country), self.labels.service_type(service_type)
        ).observe(seconds)

    def exa_error(self, model: str, status: int, body: str, *, classified: bool) -> None:
        """One sample of `mlpa_exa_errors_total` for LiteLLM's error answer (`status`, its raw
        `body`), if the model is Exa's and the error is Exa's (`exa_errors.exa_error_labels`)."""
        labels = exa_error_labels(model, status, body, classified=classified)
        if labels is not None:
            self.exa_errors.labels(*labels).inc()

    def chat_ttft(self, seconds: float, *, model: str, service_type: str, country: str | None) -> None:
        """Time to first token and its by-country twin."""
        self.ttft.labels(model).observe(seconds)
        self.ttft_by_country.labels(self.labels.launch_country(country), self.labels.service_type(service_type)).observe(
            seconds
        )

    def chat_rejection(self, reason: str, *, model: str | None, service_type: str, purpose: str) -> None:
        self.chat_rejections.labels(
            reason, self.labels.model(model), self.labels.service_type(service_type), self.labels.purpose(purpose)
        ).inc()


def exposition(metrics: Metrics, multiproc_dir: str | None) -> bytes:
    """The text exposition; aggregated across workers in multiprocess mode, with every
    live worker's process series and every worker's GC counters."""
    if multiproc_dir and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        if metrics.gc_counters is not None:
            metrics.gc_counters.sync()
        aggregate = CollectorRegistry()
        multiprocess.MultiProcessCollector(aggregate, path=multiproc_dir)
        register_multiprocess(aggregate, multiproc_dir)
        return generate_latest(aggregate)
    return generate_latest(metrics.registry)
