"""What one proxied completion's ending records: metrics and log fields.

`relay/ending.record` calls exactly one of these per request, for the ending the relay
decided; every method is synchronous, so it is safe where a handler is being cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import Classification
from ..observability import log_context
from ..observability.metrics import Metrics
from ..upstream.routing import RoutingInfo
from .judgment import Unclassified

if TYPE_CHECKING:
    from .sse import StreamAccountant


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # Function names of the completion's tool calls, by call index ("" when unnamed).
    tool_names: tuple[str, ...] = ()
    # LiteLLM's `total_tokens`, 0 when absent: what traffic contracts count (docs/traffic-contracts.md).
    total_tokens: int = 0

    @property
    def tool_calls(self) -> int:
        return len(self.tool_names)


# Traffic contracts' count of a request that reached upstream: (LiteLLM's total_tokens or 0,
# the content deltas a stream relayed or None); fleet/traffic_contracts.count_after.
CountAfterUpstream = Callable[[int, "int | None"], None]


class CompletionOutcome:
    __slots__ = ("_metrics", "model", "service_type", "purpose", "country", "_started", "count_after_upstream")

    def __init__(
        self,
        metrics: Metrics,
        *,
        model: str,
        service_type: str,
        purpose: str,
        country: str | None,
        started: float,
        count_after_upstream: CountAfterUpstream | None = None,
    ) -> None:
        self._metrics = metrics
        self.model = model
        self.service_type = service_type
        self.purpose = purpose
        # The raw `X-Geo-Country` value, for the by-country twins (MLPA 1.0.39).
        self.country = country
        self._started = started
        # None unless traffic contracts are enabled.
        self.count_after_upstream = count_after_upstream

    def _finish(self, result: str, model_label: str, availability_reason: str) -> None:
        elapsed = time.monotonic() - self._started
        m = self._metrics
        m.chat_completion_latency(
            result,
            elapsed,
            model_label=model_label,
            service_type=self.service_type,
            purpose=self.purpose,
            country=self.country,
        )
        m.chat_availability(
            availability_reason, model=self.model, service_type=self.service_type, purpose=self.purpose, country=self.country
        )
        log_context.bind(result=result, completion_seconds=round(elapsed, 4))

    def succeeded(self, usage: Usage, routing: RoutingInfo) -> None:
        # Success-side metrics use the real (validated) model name, failures the clamp.
        self._finish("success", self.model, "valid_response")
        m, labels = self._metrics, (self.model, self.service_type, self.purpose)
        for kind, count in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens)):
            if count > 0:
                m.tokens.labels(kind, *labels).inc(count)
                m.tokens_per_request.labels(kind, *labels).observe(count)
        if usage.tool_calls > 0:
            m.tool_calls.labels(*labels).inc(usage.tool_calls)
            m.completions_with_tools.labels(*labels).inc()
            m.tool_calls_per_completion.labels(*labels).observe(usage.tool_calls)
        routed = (self.model, routing.backend, self.service_type, self.purpose)
        m.routed_completions.labels(*routed, routing.fallback_used).inc()
        m.attempted_fallbacks.labels(*routed).observe(routing.attempted_fallbacks)
        m.attempted_retries.labels(*routed).observe(routing.attempted_retries)
        if routing.duration_seconds is not None:
            m.reported_duration.labels(*routed, routing.fallback_used).observe(routing.duration_seconds)
        if routing.cost_usd is not None:
            m.reported_cost.labels(*routed, routing.fallback_used).inc(routing.cost_usd)
        for kind, count in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens)):
            if count > 0:
                m.routed_tokens.labels(kind, *routed, routing.fallback_used).inc(count)
        log_context.bind(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            tool_calls=usage.tool_calls,
            tool_names=list(usage.tool_names),
            litellm_backend=routing.backend,
            litellm_fallbacks=routing.attempted_fallbacks,
            litellm_retries=routing.attempted_retries,
            litellm_duration_seconds=routing.duration_seconds,
            litellm_cost_usd=routing.cost_usd,
        )

    def upstream_answered(self, status: int, body: str, verdict: Classification | Unclassified) -> None:
        """LiteLLM answered this completion with an error status (before any chunk): the
        Exa error counter, for the Exa-backed models (after the classifier, before the
        rejection counter, as the reference records it)."""
        self._metrics.exa_error(self.model, status, body, classified=isinstance(verdict, Classification))

    def rejected(self, classification: Classification) -> None:
        self._finish("error", self._metrics.labels.model(self.model), classification.availability_reason)
        self._metrics.chat_rejection(
            classification.rejection_reason, model=self.model, service_type=self.service_type, purpose=self.purpose
        )

    def failed(self, reason: str = "upstream_error") -> None:
        self._finish("error", self._metrics.labels.model(self.model), reason)

    def aborted(self, relayed: StreamAccountant | None = None) -> None:
        """The client left; `relayed` accounts what its stream got before (docs/stream-errors-and-aborts.md,
        "What an aborted stream cost"): the usage object if one arrived, else the content deltas."""
        self._finish("abort", self._metrics.labels.model(self.model), "client_disconnect")
        if relayed is None:
            return
        counts: tuple[tuple[str, int], ...]
        if relayed.usage_seen:
            kind, counts = "usage", (("prompt", relayed.prompt_tokens), ("completion", relayed.completion_tokens))
        else:
            kind, counts = "content_deltas", (("completion", relayed.content_deltas),)
        labels = (self._metrics.labels.model(self.model), self.service_type, self.purpose, kind)
        for token_type, count in counts:
            if count > 0:
                self._metrics.aborted_stream_tokens.labels(token_type, *labels).inc(count)
        log_context.bind(
            aborted_completion_tokens=counts[-1][1], aborted_tokens_kind=kind
        )

