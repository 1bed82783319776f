"""The runbook (docs/runbook.md) has one entry per alert of config/prometheus/mlpa-alerts.yml,
by the alert's name, and no entry for an alert that does not exist. Each entry says what the
alert means and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

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
