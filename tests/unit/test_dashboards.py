"""The Grafana dashboard and the Prometheus rules reference only what the service exports,
and their PromQL parses (promtool, from Debian's `prometheus` package; .ci/run installs it).

`promtool check rules` and `promtool test rules` on the rule files themselves run in
.ci/lint-deploy; here promtool also parses every dashboard query."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import prometheus_client
import pytest
import yaml

from mlpa_aiohttp import keys
from mlpa_aiohttp.observability.metrics import Metrics
from tests.support.promql import TARGET_LABELS

from ..conftest import Service, chat_body

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "config" / "grafana" / "mlpa-dashboard.json"
RULES = ROOT / "config" / "prometheus" / "mlpa-alerts.yml"
RULE_TESTS = ROOT / "config" / "prometheus" / "mlpa-alerts.test.yml"
# Series the rules read from elsewhere: Prometheus itself and kube-state-metrics.
EXTERNAL = frozenset({"up", "kube_pod_status_ready"})
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "untyped": ("",),
}
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"})
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (matchers and grouping clauses are removed first) or durations."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("(") or match.group().lower() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def test_metric_names_parser() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, model) (rate(a_bucket{job=~"$job", x="y z"}[$__rate_interval])))'
        " / on () group_left max(b_total offset 5m) > bool 3 and c"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in panels(dashboard()) for t in p.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def exported_names(exposition: str) -> set[str]:
    """Every sample name the exposition's families can carry (from their TYPE lines, so
    families without samples yet count too)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            if kind == "counter":  # the TYPE line names a counter with its _total
                family = family.removesuffix("_total")
            names.update(family + suffix for suffix in SUFFIXES[kind])
    return names


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in board["templating"]["list"]}
    for panel in panels(board):
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used)
    titles = " | ".join(p["title"].lower() for p in panels(board))
    for wanted in ("open streams", "time to first token", "by outcome", "rejections by reason", "signup capacity", "upstream errors"):
        assert wanted in titles, wanted
    # docs/scaling.md's overload signals have panels of their own.
    for wanted in ("shed requests", "event-loop lag", "overloaded workers"):
        assert wanted in titles, wanted


def test_every_panel_says_no_data_in_words() -> None:
    """A panel whose metric has had no event yet says so, instead of an empty graph."""
    for panel in panels(dashboard()):
        if panel["type"] != "row":
            no_value = panel["fieldConfig"]["defaults"].get("noValue", "")
            assert no_value.startswith("No data: ") and len(no_value) > 15, panel["title"]


_BY_CLAUSE = re.compile(r"\b(by|without)\s*\(([^)]*)\)")


def title_labels(title: str) -> list[str]:
    """The labels a title promises ("... by reason and model", "... by status code"): each
    term as a label name (spaces as underscores) or its last word ("LiteLLM backend")."""
    match = re.search(r"\bby ([\w ,.-]+)$", title)
    if match is None:
        return []
    terms = re.split(r",\s*|\s+and\s+", match.group(1).strip())
    return [term.lower() for term in terms if term]


def keeps_label(expr: str, label: str) -> bool:
    """Whether every aggregation of `expr` keeps `label`: a `by` naming it, never a bare
    aggregation or a `without` naming it."""
    for name in re.finditer(r"\b(sum|min|max|avg|count|group|topk|bottomk|quantile|stddev|stdvar)\b\s*", expr):
        rest = expr[name.end() :]
        clause = _BY_CLAUSE.match(rest)
        if clause is None:
            return False  # sum(...) folds every label away
        names = {n.strip() for n in clause.group(2).split(",")}
        if (clause.group(1) == "by") != (label in names):
            return False
    return True


def test_a_panel_titled_by_a_label_keeps_it() -> None:
    """A panel called "... by X" (what the runbook reads off it) keeps X in every query whose
    metric has that label, instead of summing it away."""
    own = service_metrics(Metrics(prometheus_client.CollectorRegistry()))
    checked = 0
    for panel in panels(dashboard()):
        for term in title_labels(panel["title"]):
            candidates = {term.replace(" ", "_"), term.split()[-1]}
            kept_somewhere = False
            for target in panel.get("targets", []):
                names = metric_names(target["expr"])
                labels = {label for name in names if name in own for label in own[name]._labelnames} | TARGET_LABELS
                for label in candidates & labels:
                    assert keeps_label(target["expr"], label), f"{panel['title']}: {target['expr']} sums away {label}"
                    kept_somewhere = True
                    checked += 1
            assert kept_somewhere, f"{panel['title']}: no query has a label {term!r}"
    assert checked >= 10


def test_keeps_label_can_fail() -> None:
    assert not keeps_label('sum by (reason) (rate(x_total{a="b"}[5m]))', "model")
    assert not keeps_label("sum(rate(x_total[5m]))", "reason")
    assert not keeps_label("sum without (model) (rate(x_total[5m]))", "model")
    assert keeps_label("histogram_quantile(0.99, sum by (le, model) (rate(x_bucket[5m])))", "model")
    assert title_labels("Upstream errors by reason and model") == ["reason", "model"]
    assert title_labels("Not successful, by reason") == ["reason"]


def test_rules_cover_the_four_alert_families() -> None:
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert {"MlpaAvailabilityFastBurn", "MlpaPodsNotReady", "MlpaSignupCapacityNearCap", "MlpaTimeToFirstTokenP99High"} <= alerts
    for rule in rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"page", "ticket"} and rule["annotations"]["summary"], rule["alert"]


async def test_every_referenced_metric_is_exported(service: Service) -> None:
    await service.chat(chat_body(stream=True))  # not needed for names, but a realistic scrape
    response = await service.client.get("/metrics")
    assert response.status == 200
    exported = exported_names(await response.text())
    assert {"mlpa_chat_completion_ttft_seconds_bucket", "mlpa_open_streams", "process_cpu_seconds_total"} <= exported
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    referenced = {name for expr in dashboard_exprs() for name in metric_names(expr)}
    referenced |= {name for rule in rules() for name in metric_names(rule["expr"])}
    assert referenced, "the parser found nothing"
    unknown = referenced - exported - recorded - EXTERNAL
    assert not unknown, f"referenced but not exported: {sorted(unknown)}"
    assert recorded <= {name for rule in rules() if "alert" in rule for name in metric_names(rule["expr"])}, (
        "every recording rule is used by an alert"
    )


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus); CI installs it"
)


@needs_promtool
def test_dashboard_queries_parse(tmp_path: Path) -> None:
    # Grafana's variables replaced by values of the right kind, then each query checked as
    # a recording rule.
    exprs = [e.replace("$__rate_interval", "5m").replace("$job", ".*") for e in dashboard_exprs()]
    groups = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(groups))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


@needs_promtool
@pytest.mark.parametrize("bad", ["sum(rate(mlpa_requests_total[5m])", "rate(mlpa_requests_total)"])
def test_promtool_rejects_a_broken_query(tmp_path: Path, bad: str) -> None:
    """The check above can fail."""
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "x:y", "expr": bad}]}]}))
    assert subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, timeout=60).returncode != 0


# -- the rules' promtool tests feed series shaped as the service exposes them ---------------

_SERIES = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\}$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:\\.|[^"\\])*)"\s*,?')


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    match = _SERIES.match(text.strip())
    assert match, text
    labels = dict(_LABEL.findall(match["labels"]))
    return match["name"], labels


def first_value(values: str) -> tuple[float, bool]:
    """The first present sample of promtool's expanding notation ('0+90x120', '_x3 1x7')
    and whether missing samples came before it (a pod scraped for the first time later)."""
    tokens = values.split()
    missing_before = False
    for token in tokens:
        if token.startswith("_"):
            missing_before = True
            continue
        return float(re.match(r"-?[0-9.e]+", token).group()), missing_before  # type: ignore[union-attr]
    raise AssertionError(f"no sample in {values!r}")


def a_known_combination(metric: Any, labels: dict[str, str]) -> bool:
    """Whether `labels` has, for the labels the metric declares known up front, values the
    service produces together (a metric without a declaration: anything)."""
    known = metric.known_labels
    if known is None:
        return True
    declared = sorted(known.label_names())
    produced = {
        tuple(dict(zip(metric._labelnames, values))[name] for name in declared)
        for values in known.label_sets(metric._labelnames)
    }
    return tuple(labels.get(name, "") for name in declared) in produced


def service_metrics(metrics: Metrics) -> dict[str, Any]:
    """Each sample name the service's own metrics expose -> the metric."""
    found: dict[str, Any] = {}
    for metric in vars(metrics).values():
        if not isinstance(metric, prometheus_client.metrics.MetricWrapperBase):
            continue
        name, kind = metric._name, metric._type
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}[kind]
        found.update({name + suffix: metric for suffix in suffixes})
    return found


async def test_the_rule_tests_feed_series_as_the_service_exposes_them(service: Service) -> None:
    """Every input series of config/prometheus/mlpa-alerts.test.yml: a name the service
    exposes, its labels and nothing else (plus the scrape's), a known combination of the values
    the service declares up front (a reason with its own outcome, a repair site that exists),
    and, for a counter or histogram, a first value of 0 unless the series only appears later
    (a new pod, whose first scrape may already count an event)."""
    own = service_metrics(service.app[keys.METRICS])
    checked = 0
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for entry in case["input_series"]:
            name, labels = parse_series(entry["series"])
            if name in EXTERNAL:
                continue
            assert name in own, f"{name}: not a series the service exposes"
            metric = own[name]
            allowed = set(metric._labelnames) | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
            assert set(labels) <= allowed, f"{entry['series']}: labels {sorted(set(labels) - allowed)} are not the service's"
            assert a_known_combination(metric, labels), f"{entry['series']}: not a combination the service produces"
            if metric._type in ("counter", "histogram"):
                value, appears_later = first_value(entry["values"])
                assert value == 0 or appears_later, f"{entry['series']}: a counter the service exposes from 0 starts at {value}"
            checked += 1
    assert checked >= 10


def test_the_shape_check_refuses_what_the_service_never_exposes() -> None:
    """The check above can fail: the budget test's old series (a repair `at="start"` the
    service never counts for rows, born at 1) and an outcome that is not its reason's."""
    own = service_metrics(Metrics(prometheus_client.CollectorRegistry()))
    for never in (
        'mlpa_budget_rows_restored_total{job="mlpa", service_type="memories", at="start"}',
        'mlpa_chat_availability_total{outcome="failure", reason="budget_exceeded"}',
        'mlpa_shed_requests_total{reason="cpu"}',
    ):
        name, labels = parse_series(never)
        assert not a_known_combination(own[name], labels), never
    name, labels = parse_series('mlpa_budget_rows_restored_total{job="mlpa", service_type="memories", at="request"}')
    assert a_known_combination(own[name], labels)
    assert first_value("1 1 1") == (1.0, False) and first_value("_x3 1x7") == (1.0, True)


def test_the_job_variable_reads_a_series_every_pod_has_from_start() -> None:
    """A fresh pod (no request yet) is listed: its `job` comes from a series that exists at
    start, not from a counter's first event."""
    exposition = prometheus_client.generate_latest(Metrics(prometheus_client.CollectorRegistry()).registry).decode()
    present = {line.split("{")[0].split()[0] for line in exposition.splitlines() if line and not line.startswith("#")}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        (metric,) = re.findall(r"label_values\((\w+),", variable["definition"])
        assert metric in present, f"${variable['name']} reads {metric}, which a fresh pod lacks"
