"""The product catalogue: service types, their purposes, budget tiers, the known models and
model pinning.

These are facts of the wire contract (spec §2.2), not tunables; budget *values* can be
overridden from the environment in `settings.py`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


class ServiceType(enum.StrEnum):
    """The thirteen service types, in the canonical order used in error messages."""

    AI = "ai"
    S2S = "s2s"
    S2S_ANDROID = "s2s-android"
    MEMORIES = "memories"
    SEARCH = "search"
    ANSWER = "answer"
    TELEMETRY = "telemetry"
    AGENT = "agent"
    AGENT_SEARCH = "agent-search"
    AI_DEV = "ai-dev"
    MEMORIES_DEV = "memories-dev"
    MOCHI_DEV = "mochi-dev"
    SEARCH_DEV = "search-dev"

    @property
    def is_dev(self) -> bool:
        return self.value.endswith("-dev")

    @property
    def env_name(self) -> str:
        """The infix of this type's `USER_FEATURE_BUDGET_<T>_*` variables."""
        return self.value.upper().replace("-", "_")

    @classmethod
    def parse(cls, value: str) -> "ServiceType | None":
        try:
            return cls(value)
        except ValueError:
            return None


SEARCH_SERVICE_TYPES: tuple[ServiceType, ...] = (
    ServiceType.SEARCH,
    ServiceType.SEARCH_DEV,
    ServiceType.AGENT_SEARCH,
)

_AI_PURPOSES = (
    "chat",
    "title-generation",
    "convo-starters-sidebar",
    "smart-form-fill",
    "aitab",
    "auto-tab-grouping",
)

PURPOSES: Mapping[ServiceType, tuple[str, ...]] = MappingProxyType(
    {
        ServiceType.AI: _AI_PURPOSES,
        ServiceType.S2S: (),
        ServiceType.S2S_ANDROID: (),
        ServiceType.MEMORIES: ("memory-generation",),
        ServiceType.SEARCH: (),
        ServiceType.ANSWER: (),
        ServiceType.TELEMETRY: ("chat",),
        ServiceType.AGENT: ("monitor", "research"),
        ServiceType.AGENT_SEARCH: ("research",),
        ServiceType.AI_DEV: _AI_PURPOSES,
        ServiceType.MEMORIES_DEV: ("memory-generation",),
        ServiceType.MOCHI_DEV: _AI_PURPOSES,
        ServiceType.SEARCH_DEV: (),
    }
)

ALL_PURPOSES: frozenset[str] = frozenset(p for ps in PURPOSES.values() for p in ps)


@dataclass(frozen=True, slots=True)
class BudgetTier:
    budget_id: str
    max_budget: float
    rpm_limit: int
    tpm_limit: int
    budget_duration: str


def _tier(st: ServiceType, max_budget: float, rpm: int, tpm: int, duration: str = "1d") -> BudgetTier:
    return BudgetTier(f"end-user-budget-{st.value}", max_budget, rpm, tpm, duration)


DEFAULT_BUDGETS: Mapping[ServiceType, BudgetTier] = MappingProxyType(
    {
        ServiceType.AI: _tier(ServiceType.AI, 0.1, 40, 2000),
        ServiceType.S2S: _tier(ServiceType.S2S, 0.1, 40, 2000),
        ServiceType.S2S_ANDROID: _tier(ServiceType.S2S_ANDROID, 0.1, 40, 2000),
        ServiceType.MEMORIES: _tier(ServiceType.MEMORIES, 0.1, 10, 2000),
        ServiceType.SEARCH: _tier(ServiceType.SEARCH, 0.01, 10, 2000),
        ServiceType.ANSWER: _tier(ServiceType.ANSWER, 0.1, 10, 2000),
        ServiceType.TELEMETRY: _tier(ServiceType.TELEMETRY, 0.1, 10, 2000),
        ServiceType.AGENT: _tier(ServiceType.AGENT, 0.1, 10, 2000, "7d"),
        ServiceType.AGENT_SEARCH: _tier(ServiceType.AGENT_SEARCH, 0.1, 10, 2000, "7d"),
        ServiceType.AI_DEV: _tier(ServiceType.AI_DEV, 1.0, 200, 10000),
        ServiceType.MEMORIES_DEV: _tier(ServiceType.MEMORIES_DEV, 1.0, 50, 5000),
        ServiceType.MOCHI_DEV: _tier(ServiceType.MOCHI_DEV, 1.0, 200, 10000),
        ServiceType.SEARCH_DEV: _tier(ServiceType.SEARCH_DEV, 1.0, 200, 10000),
    }
)

# The models the deployment serves (spec §6): a metric's `model` label keeps only these, any
# other client-chosen name counts as "invalid". Requests naming another model are not refused
# for it here (LiteLLM decides what it serves).
KNOWN_MODELS: frozenset[str] = frozenset(
    {
        "exa",
        "exa-search",
        "gemini-2.5-flash-lite",
        "gemini-3.1-flash-lite",
        "gpt-oss-120b",
        "openai/gpt-4o",
        "mistral-small-2503",
        "mistral-small-2603",
        "moz-summarization",
        "qwen3-235b-a22b-instruct-2507-maas",
        "vertex_ai/mistral-small-2503",
    }
)

# Models that may only be used with the listed service types, and vice versa (spec §2.2).
PINNED_MODELS: Mapping[str, tuple[ServiceType, ...]] = MappingProxyType(
    {
        "exa-search": SEARCH_SERVICE_TYPES,
        "exa": (ServiceType.ANSWER,),
    }
)


def service_type_list_text() -> str:
    return ", ".join(st.value for st in ServiceType)
