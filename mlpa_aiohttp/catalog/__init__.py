"""The product catalogue: service types, their purposes, budget tiers, the known models and
model pinning.

These are facts of the wire contract (compatibility.md §2.2). The built-in catalogue (`BUILTIN_CATALOG`)
is the reference's; a deployment may replace it with a TOML file (`MLPA_CATALOG_FILE`,
docs/catalog.md) read and checked by `catalog/file.py`, and the budget variables of
`settings/__init__.py` apply on top of either. Nothing reads a module-level catalogue at run time:
the effective one travels in the settings (`Settings.catalog`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Iterable, Mapping

# A model name the chat route accepts (`models.check_model_name`); a catalogue model must match it.
MODEL_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9./_-]{0,62}[a-z0-9])?$")

# Service-type and purpose names: lowercase words joined by single hyphens. Header values
# are trimmed and compared exactly, a service type ends a LiteLLM user id after a `:`, and
# its `USER_FEATURE_BUDGET_<T>_*` infix turns `-` into `_`: this rule keeps all three safe.
CATALOG_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
CATALOG_NAME_MAX_LENGTH = 64

# The wire defaults: `/v1/search` assumes `search` when the header is absent, the mock
# no-auth route `ai`; every catalogue must keep both.
DEFAULT_SEARCH_SERVICE_TYPE = "search"
DEFAULT_CHAT_SERVICE_TYPE = "ai"


class ServiceType(enum.StrEnum):
    """The names of the built-in catalogue's fifteen service types, in its canonical order.

    Run-time code handles service types as plain strings checked against the loaded
    catalogue; these names are for code and tests that mean one built-in type."""

    AI = "ai"
    S2S = "s2s"
    S2S_ANDROID = "s2s-android"
    MEMORIES = "memories"
    SEARCH = "search"
    ANSWER = "answer"
    SW_ANSWER = "sw-answer"
    LINER_ANSWER = "liner-answer"
    TELEMETRY = "telemetry"
    AGENT = "agent"
    AGENT_SEARCH = "agent-search"
    AI_DEV = "ai-dev"
    MEMORIES_DEV = "memories-dev"
    MOCHI_DEV = "mochi-dev"
    SEARCH_DEV = "search-dev"


def env_name(service_type: str) -> str:
    """The infix of a type's `USER_FEATURE_BUDGET_<T>_*` variables, unless its entry names
    another (`ServiceTypeEntry.budget_variables`)."""
    return service_type.upper().replace("-", "_")


BUDGET_VARIABLES_PREFIX = "USER_FEATURE_BUDGET_"
# What `budget_variables` may be: the prefix, then upper-case words joined by single `_`.
BUDGET_VARIABLES = re.compile(r"^USER_FEATURE_BUDGET_[A-Z0-9]+(?:_[A-Z0-9]+)*$")


def default_budget_id(service_type: str) -> str:
    return f"end-user-budget-{service_type}"


DEFAULT_BUDGET_DURATION = "1d"

# The reference's traffic-contract features (docs/traffic-contracts.md): which shared counter a
# service type's requests count against. The names here are the defaults of FEATURE_SMART_WINDOW,
# FEATURE_S2S and FEATURE_S2S_ANDROID, which rename the counters (fleet/traffic_contracts.py).
TRAFFIC_FEATURE_SMART_WINDOW = "smart-window"
TRAFFIC_FEATURE_S2S = "s2s"
TRAFFIC_FEATURE_S2S_ANDROID = "s2s-android"
TRAFFIC_FEATURES = (TRAFFIC_FEATURE_SMART_WINDOW, TRAFFIC_FEATURE_S2S, TRAFFIC_FEATURE_S2S_ANDROID)


@dataclass(frozen=True, slots=True)
class BudgetTier:
    budget_id: str
    max_budget: float
    rpm_limit: int
    tpm_limit: int
    budget_duration: str


@dataclass(frozen=True, slots=True)
class ServiceTypeEntry:
    """One service type: the purposes it allows, its LiteLLM budget tier, and its roles."""

    name: str
    purposes: tuple[str, ...]
    budget: BudgetTier
    # Needs `x-dev-authorization` on every auth path (compatibility.md D11).
    dev: bool = False
    # Counts against the signup cap (MLPA_CAPPED_SERVICE_TYPES replaces the set).
    capped: bool = False
    # Its traffic-contract feature, one of TRAFFIC_FEATURES (the reference: every type but
    # s2s and s2s-android is smart-window).
    traffic_feature: str = TRAFFIC_FEATURE_SMART_WINDOW
    # The stem of its budget variables (`<stem>_MAX_BUDGET`, ...) when it is not
    # `USER_FEATURE_BUDGET_<T>`: the reference names liner-answer's `..._LINER_ANSWERS_*`.
    budget_variables: str | None = None

    @property
    def budget_infix(self) -> str:
        """The `<T>` of its `USER_FEATURE_BUDGET_<T>_*` variables."""
        if self.budget_variables:
            return self.budget_variables.removeprefix(BUDGET_VARIABLES_PREFIX)
        return env_name(self.name)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """A model the deployment serves; `pinned_to` non-empty: only with those service
    types, and those types only with the models pinned to them (compatibility.md §2.2)."""

    name: str
    pinned_to: tuple[str, ...] = ()
    # False: the metrics' `model` label does not keep this name ("invalid" on the failure
    # side, compatibility.md §6). The reference pins `liner` but its label allowlist holds
    # `liner-answers`: reproduced with `liner` unlabelled and `liner-answers` labelled.
    labelled: bool = True


@dataclass(frozen=True)
class Catalog:
    """An immutable catalogue; the lookups every reader uses are computed once."""

    service_types: tuple[ServiceTypeEntry, ...]
    # The types `/v1/search` accepts (and documents), in the order its 400 names them.
    search_types: tuple[str, ...]
    models: tuple[ModelEntry, ...]
    _by_name: Mapping[str, ServiceTypeEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", MappingProxyType({st.name: st for st in self.service_types}))

    # -- service types ------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Every service type, in the canonical order (error messages, docs)."""
        return tuple(self._by_name)

    def __contains__(self, service_type: object) -> bool:
        return service_type in self._by_name

    def entry(self, service_type: str) -> ServiceTypeEntry:
        return self._by_name[service_type]

    def purposes(self, service_type: str) -> tuple[str, ...]:
        return self._by_name[service_type].purposes

    @property
    def all_purposes(self) -> tuple[str, ...]:
        """Every purpose of any type, each once, in first-seen order."""
        return tuple(dict.fromkeys(p for st in self.service_types for p in st.purposes))

    @property
    def dev_types(self) -> frozenset[str]:
        return frozenset(st.name for st in self.service_types if st.dev)

    @property
    def capped_types(self) -> frozenset[str]:
        return frozenset(st.name for st in self.service_types if st.capped)

    @property
    def budgets(self) -> Mapping[str, BudgetTier]:
        return MappingProxyType({st.name: st.budget for st in self.service_types})

    @property
    def budget_infixes(self) -> Mapping[str, str]:
        """Each type's `<T>` of `USER_FEATURE_BUDGET_<T>_*`."""
        return MappingProxyType({st.name: st.budget_infix for st in self.service_types})

    @property
    def traffic_features(self) -> Mapping[str, str]:
        """Each service type's traffic-contract feature (one of TRAFFIC_FEATURES)."""
        return MappingProxyType({st.name: st.traffic_feature for st in self.service_types})

    def service_type_list_text(self) -> str:
        return ", ".join(self.names)

    # -- models ---------------------------------------------------------------------------
    @property
    def known_models(self) -> frozenset[str]:
        """The names the metrics' `model` label keeps."""
        return frozenset(m.name for m in self.models if m.labelled)

    @property
    def pinned_models(self) -> Mapping[str, tuple[str, ...]]:
        return MappingProxyType({m.name: m.pinned_to for m in self.models if m.pinned_to})

    # -- the variables on top ---------------------------------------------------------------
    def with_variables(self, budgets: Mapping[str, BudgetTier], capped: Iterable[str]) -> "Catalog":
        """This catalogue with the budget tiers and the capped set the environment chose."""
        capped_set = frozenset(capped)
        return Catalog(
            tuple(
                replace(st, budget=budgets.get(st.name, st.budget), capped=st.name in capped_set)
                for st in self.service_types
            ),
            self.search_types,
            self.models,
        )


def _type(
    name: str,
    purposes: tuple[str, ...],
    max_budget: float,
    rpm: int,
    tpm: int,
    duration: str = DEFAULT_BUDGET_DURATION,
    *,
    capped: bool = False,
    budget_variables: str | None = None,
    traffic_feature: str = TRAFFIC_FEATURE_SMART_WINDOW,
) -> ServiceTypeEntry:
    budget = BudgetTier(default_budget_id(name), max_budget, rpm, tpm, duration)
    return ServiceTypeEntry(
        name,
        purposes,
        budget,
        dev=name.endswith("-dev"),
        capped=capped,
        budget_variables=budget_variables,
        traffic_feature=traffic_feature,
    )


_AI_PURPOSES = (
    "chat",
    "title-generation",
    "convo-starters-sidebar",
    "smart-form-fill",
    "aitab",
    "auto-tab-grouping",
)
_SEARCH_TYPES = (ServiceType.SEARCH.value, ServiceType.SEARCH_DEV.value, ServiceType.AGENT_SEARCH.value)

# The reference's catalogue; config/catalog.toml spells out the same (a test keeps them equal).
BUILTIN_CATALOG = Catalog(
    service_types=(
        _type("ai", _AI_PURPOSES, 0.1, 40, 2000, capped=True),
        _type("s2s", (), 0.1, 40, 2000, traffic_feature=TRAFFIC_FEATURE_S2S),
        _type("s2s-android", (), 0.1, 40, 2000, traffic_feature=TRAFFIC_FEATURE_S2S_ANDROID),
        _type("memories", ("memory-generation",), 0.1, 10, 2000, capped=True),
        _type("search", (), 0.01, 10, 2000),
        _type("answer", (), 0.1, 10, 2000),
        _type("sw-answer", (), 0.1, 10, 2000),
        # The reference's variables for this tier say ANSWERS (plural).
        _type("liner-answer", (), 0.06, 10, 2000, budget_variables="USER_FEATURE_BUDGET_LINER_ANSWERS"),
        _type("telemetry", ("chat",), 0.1, 10, 2000),
        _type("agent", ("monitor", "research"), 0.1, 10, 2000, "7d"),
        _type("agent-search", ("research",), 0.1, 10, 2000, "7d"),
        _type("ai-dev", _AI_PURPOSES, 1.0, 200, 10000),
        _type("memories-dev", ("memory-generation",), 1.0, 50, 5000),
        _type("mochi-dev", _AI_PURPOSES, 1.0, 200, 10000),
        _type("search-dev", (), 1.0, 200, 10000),
    ),
    search_types=_SEARCH_TYPES,
    # The models the deployment serves (compatibility.md §6): a metric's `model` label keeps only
    # these, any other client-chosen name counts as "invalid". Requests naming another
    # model are not refused for it here (LiteLLM decides what it serves).
    models=(
        ModelEntry("exa", pinned_to=(ServiceType.ANSWER.value, ServiceType.SW_ANSWER.value)),
        ModelEntry("exa-search", pinned_to=_SEARCH_TYPES),
        ModelEntry("gemini-2.5-flash-lite"),
        ModelEntry("gemini-3.1-flash-lite"),
        ModelEntry("gpt-oss-120b"),
        ModelEntry("liner", pinned_to=(ServiceType.LINER_ANSWER.value,), labelled=False),
        ModelEntry("liner-answers"),
        ModelEntry("openai/gpt-4o"),
        ModelEntry("mistral-small-2503"),
        ModelEntry("mistral-small-2603"),
        ModelEntry("moz-summarization"),
        ModelEntry("qwen3-235b-a22b-instruct-2507-maas"),
        ModelEntry("vertex_ai/mistral-small-2503"),
    ),
)
