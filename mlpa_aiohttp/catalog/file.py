"""The catalogue file (`MLPA_CATALOG_FILE`, docs/catalog.md): TOML in, a checked `Catalog`
out, and back to TOML for `python -m mlpa_aiohttp catalog show`.

`parse_catalog` never stops at the first mistake: every problem of the file is collected
(unknown keys with the closest known name, wrong types, duplicates, names the header rules
would refuse, references to service types that do not exist), so one run lists them all.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from typing import Any, Callable, Iterable, TypeVar

from . import (
    BUDGET_VARIABLES,
    CATALOG_NAME,
    CATALOG_NAME_MAX_LENGTH,
    DEFAULT_BUDGET_DURATION,
    DEFAULT_CHAT_SERVICE_TYPE,
    DEFAULT_SEARCH_SERVICE_TYPE,
    MODEL_NAME,
    TRAFFIC_FEATURE_SMART_WINDOW,
    TRAFFIC_FEATURES,
    BudgetTier,
    Catalog,
    ModelEntry,
    ServiceTypeEntry,
    default_budget_id,
)

T = TypeVar("T")

# LiteLLM's budget durations: seconds, minutes, hours, days, months ("30s", "1d", "1mo").
BUDGET_DURATION = re.compile(r"^[1-9][0-9]*(?:s|m|h|d|mo)$")

_TOP_KEYS = ("search_service_types", "service_type", "model")
_SERVICE_TYPE_KEYS = ("name", "purposes", "dev", "capped", "budget", "budget_variables", "traffic_feature")
_BUDGET_KEYS = ("budget_id", "max_budget", "rpm_limit", "tpm_limit", "budget_duration")
_MODEL_KEYS = ("name", "pinned_to", "metric_label")


class CatalogError(ValueError):
    """The file cannot be used; `problems` has one line per mistake."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


def load_catalog(path: str) -> Catalog:
    """The catalogue in the file at `path`; raises `CatalogError` listing every problem."""
    return parse_catalog(read_catalog_file(path))


def read_catalog_file(path: str) -> bytes:
    """The file's bytes; raises `CatalogError` when it cannot be read."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise CatalogError([f"cannot read the file: {exc.strerror or exc}"]) from None


def parse_catalog(raw: bytes) -> Catalog:
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CatalogError([f"not UTF-8 text (byte {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError([f"not valid TOML: {exc}"]) from None
    reader = _Reader()
    catalog = reader.catalog(document)
    if reader.problems or catalog is None:
        raise CatalogError(reader.problems)
    return catalog


class _Reader:
    """Reads a parsed document, recording every problem and going on where it can."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def problem(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}" if where else message)

    def known_keys(self, table: dict[str, Any], known: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in known:
                closest = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f"; did you mean {closest[0]!r}?" if closest else f" (known keys: {', '.join(known)})"
                self.problem(where, f"unknown key {key!r}{hint}")

    def value(
        self, table: dict[str, Any], key: str, where: str, check: Callable[[Any], T | None], kind: str, default: Any
    ) -> Any:
        """`table[key]` if `check` accepts it; else a problem and `default`. `default` is
        `_REQUIRED` for a key that must be present."""
        here = f"{where}.{key}" if where else key
        if key not in table:
            if default is _REQUIRED:
                self.problem(here, "missing")
            return None if default is _REQUIRED else default
        checked = check(table[key])
        if checked is None:
            self.problem(here, f"expected {kind}, got {_shown(table[key])}")
            return None if default is _REQUIRED else default
        return checked

    def names(self, values: Any, where: str, what: str) -> tuple[str, ...]:
        """A list of catalogue names, each checked and each once."""
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            self.problem(where, f"expected a list of {what} names, got {_shown(values)}")
            return ()
        seen: list[str] = []
        for name in values:
            if name in seen:
                self.problem(where, f"{what} {name!r} is listed twice")
                continue
            self.name_rule(name, where, what)
            seen.append(name)
        return tuple(seen)

    def name_rule(self, name: str, where: str, what: str) -> None:
        if not CATALOG_NAME.match(name) or len(name) > CATALOG_NAME_MAX_LENGTH:
            self.problem(
                where,
                f"{what} name {name!r} is not allowed: lowercase letters and digits in words joined by single "
                f"hyphens, at most {CATALOG_NAME_MAX_LENGTH} characters (it travels in a header and in the "
                "LiteLLM user id)",
            )

    # -- the document ---------------------------------------------------------------------
    def catalog(self, document: dict[str, Any]) -> Catalog | None:
        self.known_keys(document, _TOP_KEYS, "")
        tables = document.get("service_type")
        if tables is None:
            self.problem("service_type", "missing: the file must list every service type ([[service_type]] tables)")
            tables = []
        elif not _is_table_list(tables):
            self.problem("service_type", f"expected [[service_type]] tables, got {_shown(tables)}")
            tables = []
        entries = self.service_types(tables)
        # References are checked against every name the file declares, valid entry or not,
        # so that one mistake in a type does not hide another elsewhere.
        names = [table["name"] for table in tables if isinstance(table.get("name"), str)]
        search_types = self.search_types(document, names)
        models = self.models(document.get("model", []), set(names))
        for required in (DEFAULT_CHAT_SERVICE_TYPE, DEFAULT_SEARCH_SERVICE_TYPE):
            if tables and required not in names:
                self.problem(
                    "service_type",
                    f"{required!r} is missing: it is the default service-type of "
                    + ("/v1/search" if required == DEFAULT_SEARCH_SERVICE_TYPE else "the mock no-auth route"),
                )
        if self.problems:
            return None
        return Catalog(tuple(entries), search_types, tuple(models))

    def service_types(self, tables: list[dict[str, Any]]) -> list[ServiceTypeEntry]:
        entries: list[ServiceTypeEntry] = []
        seen_names: dict[str, str] = {}
        seen_env: dict[str, str] = {}
        seen_budget_ids: dict[str, str] = {}
        for number, table in enumerate(tables, 1):
            name = table.get("name")
            where = f"service_type #{number}" + (f" {name!r}" if isinstance(name, str) else "")
            duplicate = isinstance(name, str) and name in seen_names
            if duplicate:
                self.problem(where, f"duplicate service type {name!r} (also {seen_names[name]})")
            elif isinstance(name, str):
                seen_names[name] = f"service_type #{number}"
            entry = self.service_type(table, where)
            if entry is None or duplicate:
                continue
            infix = entry.budget_infix
            if infix in seen_env:
                self.problem(where, f"shares its USER_FEATURE_BUDGET_{infix}_* variables with {seen_env[infix]}")
            seen_env.setdefault(infix, where)
            budget_id = entry.budget.budget_id
            if budget_id in seen_budget_ids:
                self.problem(
                    where,
                    f"budget.budget_id {budget_id!r} is also the budget_id of {seen_budget_ids[budget_id]}: each "
                    "tier needs its own LiteLLM budget row",
                )
            seen_budget_ids.setdefault(budget_id, where)
            entries.append(entry)
        return entries

    def service_type(self, table: dict[str, Any], where: str) -> ServiceTypeEntry | None:
        self.known_keys(table, _SERVICE_TYPE_KEYS, where)
        before = len(self.problems)
        name = self.value(table, "name", where, _text, "a string", _REQUIRED)
        if name is not None:
            self.name_rule(name, where, "service type")
        purposes = self.names(table.get("purposes", []), f"{where}.purposes", "purpose")
        dev = self.value(table, "dev", where, _boolean, "true or false", False)
        capped = self.value(table, "capped", where, _boolean, "true or false", False)
        budget_variables = self.value(
            table, "budget_variables", where, _budget_variables,
            "USER_FEATURE_BUDGET_ then upper-case words joined by single underscores", None,
        )
        traffic_feature = self.value(
            table, "traffic_feature", where, _traffic_feature, "one of " + ", ".join(map(repr, TRAFFIC_FEATURES)),
            TRAFFIC_FEATURE_SMART_WINDOW,
        )
        if name is not None and name.endswith("-dev") and not dev:
            self.problem(
                where,
                f"{name!r} ends with -dev but dev is not true: set dev = true (dev types need x-dev-authorization, "
                "compatibility.md D11) or choose another name",
            )
        budget_table = table.get("budget")
        budget = None
        if budget_table is None:
            self.problem(f"{where}.budget", "missing: every service type has a LiteLLM budget tier")
        elif not isinstance(budget_table, dict):
            self.problem(f"{where}.budget", f"expected a table, got {_shown(budget_table)}")
        elif name is not None:
            budget = self.budget(budget_table, f"{where}.budget", name)
        if name is None or budget is None or len(self.problems) > before:
            return None
        return ServiceTypeEntry(
            name,
            purposes,
            budget,
            dev=dev,
            capped=capped,
            budget_variables=budget_variables,
            traffic_feature=traffic_feature,
        )

    def budget(self, table: dict[str, Any], where: str, service_type: str) -> BudgetTier | None:
        self.known_keys(table, _BUDGET_KEYS, where)
        before = len(self.problems)
        tier = BudgetTier(
            budget_id=self.value(table, "budget_id", where, _text, "a non-empty string", default_budget_id(service_type)),
            max_budget=self.value(table, "max_budget", where, _amount, "a number of at least 0 (USD)", _REQUIRED),
            rpm_limit=self.value(table, "rpm_limit", where, _count, "an integer of at least 0", _REQUIRED),
            tpm_limit=self.value(table, "tpm_limit", where, _count, "an integer of at least 0", _REQUIRED),
            budget_duration=self.value(
                table, "budget_duration", where, _duration, 'a LiteLLM duration ("30s", "1h", "1d", "7d", "1mo")',
                DEFAULT_BUDGET_DURATION,
            ),
        )
        return None if len(self.problems) > before else tier

    def search_types(self, document: dict[str, Any], names: list[str]) -> tuple[str, ...]:
        if "search_service_types" not in document:
            self.problem("search_service_types", "missing: the service types /v1/search accepts, in order")
            return ()
        listed = self.names(document["search_service_types"], "search_service_types", "service type")
        for name in listed:
            if names and name not in names:
                self.problem("search_service_types", f"{name!r} is not a service type of this file{_closest(name, names)}")
        if names and DEFAULT_SEARCH_SERVICE_TYPE in names and DEFAULT_SEARCH_SERVICE_TYPE not in listed:
            self.problem("search_service_types", f"must include {DEFAULT_SEARCH_SERVICE_TYPE!r} (/v1/search's default)")
        return listed

    def models(self, tables: Any, names: set[str]) -> list[ModelEntry]:
        if not _is_table_list(tables):
            self.problem("model", f"expected [[model]] tables, got {_shown(tables)}")
            return []
        models: list[ModelEntry] = []
        seen: set[str] = set()
        for number, table in enumerate(tables, 1):
            name = table.get("name")
            where = f"model #{number}" + (f" {name!r}" if isinstance(name, str) else "")
            self.known_keys(table, _MODEL_KEYS, where)
            name = self.value(table, "name", where, _text, "a string", _REQUIRED)
            if name is None:
                continue
            if not MODEL_NAME.match(name):
                self.problem(where, f"model name {name!r} is one the chat route refuses (pattern {MODEL_NAME.pattern})")
            if name in seen:
                self.problem(where, f"duplicate model {name!r}")
                continue
            seen.add(name)
            pinned = self.names(table.get("pinned_to", []), f"{where}.pinned_to", "service type")
            for service_type in pinned:
                if names and service_type not in names:
                    self.problem(
                        f"{where}.pinned_to",
                        f"{service_type!r} is not a service type of this file{_closest(service_type, names)}",
                    )
            labelled = self.value(table, "metric_label", where, _boolean, "true or false", True)
            models.append(ModelEntry(name, pinned, labelled=labelled))
        return models


_REQUIRED: Any = object()


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() == value and value else None


def _boolean(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _traffic_feature(value: Any) -> str | None:
    return value if value in TRAFFIC_FEATURES else None


def _amount(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


def _budget_variables(value: Any) -> str | None:
    return value if isinstance(value, str) and BUDGET_VARIABLES.match(value) else None


def _duration(value: Any) -> str | None:
    return value if isinstance(value, str) and BUDGET_DURATION.match(value) else None


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return repr(value)


def _closest(name: str, names: Iterable[str]) -> str:
    closest = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"; did you mean {closest[0]!r}?" if closest else ""


# -- back to TOML ----------------------------------------------------------------------------


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of these names is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    raise TypeError(f"no TOML for {type(value).__name__}")


def render_catalog(catalog: Catalog) -> str:
    """The catalogue as a file `parse_catalog` reads back to an equal catalogue."""
    lines = [f"search_service_types = {_toml(catalog.search_types)}", ""]
    for entry in catalog.service_types:
        tier = entry.budget
        lines += [
            "[[service_type]]",
            f"name = {_toml(entry.name)}",
            f"purposes = {_toml(entry.purposes)}",
            f"dev = {_toml(entry.dev)}",
            f"capped = {_toml(entry.capped)}",
            f"traffic_feature = {_toml(entry.traffic_feature)}",
            f"budget = {{ budget_id = {_toml(tier.budget_id)}, max_budget = {_toml(tier.max_budget)}, "
            f"rpm_limit = {_toml(tier.rpm_limit)}, tpm_limit = {_toml(tier.tpm_limit)}, "
            f"budget_duration = {_toml(tier.budget_duration)} }}",
        ]
        if entry.budget_variables:
            lines.append(f"budget_variables = {_toml(entry.budget_variables)}")
        lines.append("")
    for model in catalog.models:
        lines += ["[[model]]", f"name = {_toml(model.name)}"]
        if model.pinned_to:
            lines.append(f"pinned_to = {_toml(model.pinned_to)}")
        if not model.labelled:
            lines.append("metric_label = false")
        lines.append("")
    return "\n".join(lines)
