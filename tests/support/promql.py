"""The series a PromQL expression reads, for checking shipped rules against a real /metrics.

A small tokenizer and walk, enough for what rule files and prometheus-adapter rules hold:
vector selectors (`name{label op "value", ...}`), functions, aggregations with their
`by`/`without` clauses, binary operators with `on`/`ignoring`/`group_left`, ranges,
subqueries, `offset`. Only selectors come out; label names in grouping clauses, function
names, keywords, numbers and durations do not. promtool checks that an expression parses
(.ci/lint-deploy, tests/unit/test_dashboards.py); this says what it reads.

Where the rules live: every `groups:` file in config/prometheus, and every file in
config/kubernetes whose `rules:` are prometheus-adapter's (`seriesQuery`, `metricsQuery`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk"}
    | {"quantile", "limitk", "limit_ratio"}
)
# Followed by a parenthesised list of label names, not an expression.
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2", "start", "end"})
# Labels Prometheus attaches when it scrapes (or the usual Kubernetes relabelling does):
# never in the service's exposition, so a matcher on them says nothing about it.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod"})

_TOKEN = re.compile(
    r"""
      (?P<space>\s+|\#[^\n]*)
    | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    | (?P<number>[0-9.][0-9A-Za-z_.]*)
    | (?P<variable>\$\w+|\$\{[^}]*\})
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<matchop>=~|!~|!=|==|=)
    | (?P<punct>[{}()\[\],]|<=|>=|[-+*/%^<>@])
    """,
    re.VERBOSE,
)
_LITERAL_ALTERNATION = re.compile(r"[A-Za-z0-9_:./-]+(\|[A-Za-z0-9_:./-]+)*")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str  # =, !=, =~, !~
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.label, "")  # an absent label reads as empty, as in Prometheus
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = re.fullmatch(self.value, actual) is not None
        return found if self.op == "=~" else not found

    def required_values(self) -> tuple[str, ...] | None:
        """The values each of which must have a series: a `=` value, or every alternative of a
        `=~` that is a plain alternation ("success|failure"); None for anything else."""
        if self.op == "=":
            return (self.value,)
        if self.op == "=~" and _LITERAL_ALTERNATION.fullmatch(self.value):
            return tuple(self.value.split("|"))
        return None


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[Matcher, ...]

    def __str__(self) -> str:
        inner = ", ".join(f'{m.label}{m.op}"{m.value}"' for m in self.matchers)
        return f"{self.name}{{{inner}}}"

    def service_matchers(self) -> tuple[Matcher, ...]:
        return tuple(m for m in self.matchers if m.label not in TARGET_LABELS)


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot read PromQL at {expr[position:position + 20]!r} in {expr!r}")
        position = match.end()
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append((kind, match.group()))
    return tokens


def _unquote(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    return bytes(text[1:-1], "utf-8").decode("unicode_escape")


def selectors(expr: str) -> list[Selector]:
    """Every vector selector of `expr`, in order."""
    tokens = _tokens(expr)
    found: list[Selector] = []
    index = 0

    def skip_group(start: int, opening: str, closing: str) -> int:
        depth = 0
        for position in range(start, len(tokens)):
            if tokens[position][1] == opening:
                depth += 1
            elif tokens[position][1] == closing:
                depth -= 1
                if depth == 0:
                    return position + 1
        raise ValueError(f"unbalanced {opening} in {expr!r}")

    def read_matchers(start: int) -> tuple[list[Matcher], int]:
        matchers, position = [], start + 1
        while tokens[position][1] != "}":
            (label_kind, label), (op_kind, op), (value_kind, value) = tokens[position : position + 3]
            if label_kind != "ident" or op_kind != "matchop" or value_kind != "string":
                raise ValueError(f"cannot read the matchers of {expr!r}")
            matchers.append(Matcher(label, op, _unquote(value)))
            position += 3
            if tokens[position][1] == ",":
                position += 1
        return matchers, position + 1

    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if kind == "ident" and text in GROUPING and following == "(":
            index = skip_group(index + 1, "(", ")")
        elif kind == "ident" and (following == "(" or text in AGGREGATIONS or text in GROUPING or text.lower() in KEYWORDS):
            index += 1  # a function, an aggregation or a keyword
        elif kind == "ident":
            matchers: list[Matcher] = []
            index += 1
            if following == "{":
                matchers, index = read_matchers(index)
            found.append(Selector(text, tuple(matchers)))
        elif text == "{":  # a selector by matchers alone: {__name__="..."}
            matchers, index = read_matchers(index)
            names = [m.value for m in matchers if m.label == "__name__" and m.op == "="]
            found.append(Selector(names[0] if names else "", tuple(m for m in matchers if m.label != "__name__")))
        elif text == "[":
            index = skip_group(index, "[", "]")
        else:
            index += 1
    return found


@dataclass(frozen=True)
class RuleExpr:
    source: str  # where it is: file and rule
    expr: str


def prometheus_rule_exprs(directory: Path = REPO / "config" / "prometheus") -> tuple[list[RuleExpr], set[str]]:
    """Every rule expression of the rule files (`groups:`), and the names recording rules define."""
    exprs, recorded = [], set()
    for path in sorted(directory.glob("*.y*ml")):
        document = yaml.safe_load(path.read_text())
        if not isinstance(document, dict) or "groups" not in document:
            continue  # e.g. a promtool test file
        for group in document["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule["record"]
                exprs.append(RuleExpr(f"{path.relative_to(REPO)}: {name}", rule["expr"]))
                if "record" in rule:
                    recorded.add(rule["record"])
    return exprs, recorded


def adapter_rules(directory: Path = REPO / "config" / "kubernetes") -> Iterator[tuple[Path, dict]]:
    """Every prometheus-adapter rule (a `rules:` entry with a `seriesQuery`) and its file."""
    for path in sorted(directory.rglob("*.y*ml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not isinstance(document, dict) or not isinstance(document.get("rules"), list):
                continue
            for rule in document["rules"]:
                if isinstance(rule, dict) and "seriesQuery" in rule:
                    yield path, rule


def adapter_metric_names(directory: Path = REPO / "config" / "kubernetes") -> set[str]:
    """The names the adapter serves to autoscalers (`name.as`)."""
    return {rule["name"]["as"] for _, rule in adapter_rules(directory) if "as" in rule.get("name", {})}


def adapter_rule_exprs(directory: Path = REPO / "config" / "kubernetes") -> list[RuleExpr]:
    """prometheus-adapter's rules: each `seriesQuery`, and its `metricsQuery` with the
    adapter's template filled in for the series that query finds."""
    exprs = []
    for path, rule in adapter_rules(directory):
        where = f"{path.relative_to(REPO)}: {rule['seriesQuery']}"
        exprs.append(RuleExpr(where, rule["seriesQuery"]))
        (series,) = selectors(rule["seriesQuery"])
        query = rule.get("metricsQuery", "")
        query = query.replace("<<.Series>>", series.name).replace("<<.LabelMatchers>>", 'pod="p"')
        query = query.replace("<<.GroupBy>>", "pod")
        if query:
            exprs.append(RuleExpr(where + " (metricsQuery)", query))
    return exprs


def unmet(selector: Selector, samples: list[tuple[str, dict[str, str]]]) -> list[str]:
    """What `selector` reads that `samples` (name and labels, as exposed) do not have: its
    name, or, for each matcher naming values, a value with no series (the other matchers
    held)."""
    named = [labels for name, labels in samples if name == selector.name]
    own = selector.service_matchers()
    if not any(all(m.matches(labels) for m in own) for labels in named):
        return [str(selector)]
    missing = []
    for matcher in own:
        others = [m for m in own if m is not matcher]
        for value in matcher.required_values() or ():
            wanted = Matcher(matcher.label, "=", value)
            if not any(wanted.matches(labels) and all(m.matches(labels) for m in others) for labels in named):
                missing.append(f'{selector} (no series with {matcher.label}="{value}")')
    return missing


def rule_selectors(exprs: list[RuleExpr], recorded: set[str], external: frozenset[str]) -> Iterator[tuple[RuleExpr, Selector]]:
    """The selectors of the service's own series: not recording rules' outputs, not `external`."""
    for rule in exprs:
        for selector in selectors(rule.expr):
            if selector.name not in recorded and selector.name not in external:
                yield rule, selector
