"""The runbook (docs/runbook.md) has one entry per alert of config/prometheus/mlpa-alerts.yml,
by the alert's name, and no entry for an alert that does not exist. Each entry says what the
alert means and what to do. What the runbook and the other docs name exists: every panel
(config/grafana/mlpa-dashboard.json) and every metric, by the name /metrics exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import prometheus_client
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp.observability.metrics import Metrics
from mlpa_aiohttp.observability.runtime_metrics import GCPauses, WorkerGCCounters
from tests.support.promql import adapter_metric_names, prometheus_rule_exprs

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "config" / "prometheus" / "mlpa-alerts.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
# An entry is a second-level heading that is one word: the alert's name.
ENTRY = re.compile(r"^## (\S+)[ \t]*$", re.MULTILINE)


def alert_names() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def runbook_entries() -> dict[str, str]:
    """Each entry's name and its text, up to the next second-level heading."""
    text = RUNBOOK.read_text(encoding="utf-8")
    matches = list(ENTRY.finditer(text))
    entries = {}
    for match in matches:
        end = text.find("\n## ", match.end())
        entries[match.group(1)] = text[match.end() : end if end != -1 else len(text)]
    return entries


def test_the_rules_define_alerts() -> None:
    names = alert_names()
    assert len(names) >= 5 and len(names) == len(set(names)), names


def test_every_alert_has_a_runbook_entry_and_every_entry_an_alert() -> None:
    entries, alerts = set(runbook_entries()), set(alert_names())
    assert not alerts - entries, f"alerts without a runbook entry in docs/runbook.md: {sorted(alerts - entries)}"
    assert not entries - alerts, f"runbook entries naming no alert of {RULES.name}: {sorted(entries - alerts)}"


def test_each_entry_says_what_the_alert_means_and_what_to_do() -> None:
    for name, text in runbook_entries().items():
        means = re.search(r"\*\*Means\.\*\*\s+(\S.*?)(?=\n\n)", text, re.DOTALL)
        do = re.search(r"\*\*Do\.\*\*\s+(\S.*)", text, re.DOTALL)
        assert means and len(means.group(1)) > 40, f"{name}: no **Means.** paragraph"
        assert do and len(do.group(1)) > 40, f"{name}: no **Do.** paragraph"


# -- what the docs name: the dashboard's panels and the service's metrics ---------------------

DASHBOARD = REPO / "config" / "grafana" / "mlpa-dashboard.json"
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
# A run of quoted titles right before "panel(s)" or "row": `the "A" and "B" panels`.
NAMED_PANELS = re.compile(r'((?:"[^"\n]+"(?:,\s*|\s+and\s+|\s+or\s+)?)+)\s+(?:panels?|row)\b')
QUOTED = re.compile(r'"([^"]+)"')
# Identifiers that look like metric names but are not: the package, a header, a readiness field.
NOT_METRICS = frozenset({"mlpa_aiohttp", "mlpa_ui_access_key", "mlpa_version"})
METRIC_LIKE = re.compile(r"\b(?:mlpa|process|python)_[a-z0-9_]*[a-z0-9](?![a-z0-9_]*\*)")


def prose(text: str) -> str:
    """The text without fenced blocks and code spans, lines joined (a title may wrap)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`]*`", "``", text)
    return re.sub(r"\s*\n\s*", " ", text)


def dashboard_titles() -> set[str]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    titles = set()
    for panel in board["panels"]:
        titles.add(panel["title"])
        titles.update(inner["title"] for inner in panel.get("panels", []))
    return titles


def row_titles() -> set[str]:
    """Row titles and their first words ("Overload" of "Overload (OVERLOAD_PROTECTION, ...)")."""
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    rows = [panel["title"] for panel in board["panels"] if panel["type"] == "row"]
    return set(rows) | {title.split(" (")[0] for title in rows}


def test_every_quoted_name_in_the_runbook_is_a_panel_or_row_of_the_dashboard() -> None:
    """The runbook quotes panels by their titles and nothing else in its prose."""
    known = dashboard_titles() | row_titles()
    quoted = QUOTED.findall(prose(RUNBOOK.read_text(encoding="utf-8")))
    assert len(quoted) >= 8, quoted
    unknown = sorted(set(quoted) - known)
    assert not unknown, f"docs/runbook.md names panels the dashboard lacks: {unknown}"


def test_every_panel_a_doc_names_exists() -> None:
    known = dashboard_titles() | row_titles()
    named, unknown = 0, []
    for path in DOCS:
        for run in NAMED_PANELS.finditer(prose(path.read_text(encoding="utf-8"))):
            for title in QUOTED.findall(run.group(1)):
                named += 1
                if title not in known:
                    unknown.append(f"{path.relative_to(REPO)}: {title!r}")
    assert named >= 10
    assert not unknown, "panels named in the docs that the dashboard lacks:\n" + "\n".join(unknown)


def exposed_metric_names() -> set[str]:
    """What a Prometheus user can type: every family and sample name of a fresh /metrics
    (one process, its known series at 0), the multiprocess-only GC counters, the adapter's
    served names and the recording rules' outputs. A counter's family is `<name>_total`:
    prometheus-client's TYPE line names it so, and a bare `<name>` selects nothing."""
    metrics = Metrics(CollectorRegistry())
    names = set()
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        names.add(family.name + "_total" if family.type == "counter" else family.name)
        names.update(sample.name for sample in family.samples)
    for counter in vars(WorkerGCCounters(GCPauses())).values():
        for kind in counter.values() if isinstance(counter, dict) else [counter]:
            if isinstance(kind, prometheus_client.Counter):
                names.add(kind._name + "_total")
    names.update(adapter_metric_names())
    names.update(prometheus_rule_exprs()[1])
    return names


def test_every_metric_a_doc_names_is_exposed_by_that_name() -> None:
    exposed = exposed_metric_names()
    assert {"mlpa_requests_total", "mlpa_gc_pauses_total", "mlpa_shed_requests_per_second", "process_cpu_seconds_total"} <= exposed
    mentioned, unknown = 0, []
    for path in DOCS:
        for match in METRIC_LIKE.finditer(path.read_text(encoding="utf-8")):
            name = match.group()
            if name in NOT_METRICS or name.startswith("mlpa_aiohttp"):
                continue
            mentioned += 1
            if name not in exposed:
                hint = " (a counter: add _total)" if name + "_total" in exposed else ""
                unknown.append(f"{path.relative_to(REPO)}: {name}{hint}")
    assert mentioned >= 30
    assert not unknown, "metrics named in the docs that /metrics does not expose by that name:\n" + "\n".join(unknown)
