"""The configuration reference is made from the settings and committed as made: every variable
read is documented once, with a meaning, its default as read, and secrets marked
(settings/reference.py; docs/configuration.md, config/example.env)."""

from __future__ import annotations

import collections
import dataclasses
import difflib
import typing
from pathlib import Path

import pytest

from mlpa_aiohttp import settings as settings_module
from mlpa_aiohttp.process.startup import EXIT_CONFIG
from mlpa_aiohttp.settings import Settings, field_variable, variable_names
from mlpa_aiohttp.settings.compat import NOT_READ, READ_ELSEWHERE, RENAMED
from mlpa_aiohttp.settings.reference import (
    ENV_COMMAND,
    ENV_PATH,
    MARKDOWN_COMMAND,
    MARKDOWN_PATH,
    TYPE_PLACEHOLDER,
    example_env,
    reference_markdown,
    sections,
)
from tests.support.documented_names import documented_names

from ..conftest import TEST_SECRETS

REPO = Path(__file__).resolve().parents[2]


def not_current(path: str, made: str, command: str) -> str:
    committed = (REPO / path).read_text(encoding="utf-8")
    if committed == made:
        return ""
    diff = difflib.unified_diff(committed.splitlines(), made.splitlines(), "committed", "made now", lineterm="", n=1)
    return f"{path} is not what the settings make now; regenerate it:\n    {command}\n" + "\n".join(list(diff)[:40])


@pytest.mark.parametrize(
    ("path", "make", "command"),
    [(MARKDOWN_PATH, lambda: reference_markdown(EXIT_CONFIG), MARKDOWN_COMMAND), (ENV_PATH, example_env, ENV_COMMAND)],
)
def test_the_committed_reference_is_what_the_settings_make(path: str, make: typing.Callable[[], str], command: str) -> None:
    problem = not_current(path, make(), command)
    assert not problem, problem


def test_the_staleness_message_names_the_command_and_the_difference() -> None:
    made = reference_markdown(EXIT_CONFIG).replace("| `PORT` | `8080` |", "| `PORT` | `9090` |")
    problem = not_current(MARKDOWN_PATH, made, MARKDOWN_COMMAND)
    assert MARKDOWN_COMMAND in problem
    assert "-| `PORT` | `8080` |" in problem and "+| `PORT` | `9090` |" in problem


def test_every_variable_read_is_documented_exactly_once() -> None:
    names = documented_names()
    twice = [name for name, count in collections.Counter(names).items() if count > 1]
    assert not twice
    assert set(names) == variable_names() | set(READ_ELSEWHERE)


def settings_fields() -> typing.Iterator[tuple[str, dataclasses.Field[typing.Any]]]:
    hints = typing.get_type_hints(Settings)
    for spec in dataclasses.fields(Settings):
        if field_variable(spec) is not None:
            yield spec.name, spec
        else:
            for inner in dataclasses.fields(hints[spec.name]):
                yield f"{spec.name}.{inner.name}", inner


def is_reference_prose(text: str) -> bool:
    """One or more sentences on one line, fit for a table cell and an env file comment."""
    return bool(text) and text.endswith(".") and "\n" not in text and "|" not in text and not text[0].islower()


def test_every_variable_has_a_meaning_in_reference_prose() -> None:
    checked = 0
    for path, spec in settings_fields():
        var = field_variable(spec)
        if var is None:
            continue  # fixed values, set by no variable
        meanings = [var.meaning] if var.read is None else [doc.meaning for doc in var.documents]
        if var.read is not None and not var.documents:
            pytest.fail(f"{path} reads variables it does not document")
        for meaning in meanings:
            assert is_reference_prose(meaning), f"{path}: {meaning!r}"
            checked += 1
    for name, spec in READ_ELSEWHERE.items():
        assert is_reference_prose(spec.meaning), name
    assert checked >= 80


def test_every_section_has_a_heading_and_an_introduction() -> None:
    found = sections()
    headings = [section.heading for section in found]
    assert len(headings) == len(set(headings))
    nested = [section for section in found if section.intro]
    assert len(nested) == sum(1 for spec in dataclasses.fields(Settings) if field_variable(spec) is None) + 1


def test_exactly_the_secret_fields_are_marked_secret() -> None:
    secret_fields = {field_variable(spec).name for _path, spec in settings_fields() if field_variable(spec) and not spec.repr}
    assert {"MASTER_KEY", "DB_PASSWORD", "SENTRY_DSN"} <= secret_fields
    entries = [entry for section in sections() for entry in section.entries]
    assert {entry.name for entry in entries if entry.secret} == secret_fields
    rows = {line.split("|")[1].strip(" `"): line for line in reference_markdown(EXIT_CONFIG).splitlines() if line.startswith("| `")}
    for entry in entries:
        assert ("**secret**" in rows[entry.name]) == entry.secret, entry.name
    refused = {entry.name for entry in entries if entry.refused}
    assert refused == set(settings_module.DEFAULT_SECRETS)
    assert all("*refused*" in rows[name] for name in refused)


def test_each_default_shown_is_the_value_read() -> None:
    """Every value an entry shows, set as the variable, reads back as the default (outside
    MLPA_DEBUG and the demo, whose own defaults the entry names besides)."""
    baseline = Settings.from_environ(TEST_SECRETS)
    shown = 0
    for section in sections():
        for entry in section.entries:
            if entry.name in READ_ELSEWHERE or TYPE_PLACEHOLDER in entry.name:
                continue
            value = entry.env_value if entry.env_value is not None else entry.env_example
            if entry.env_value:
                assert f"`{entry.env_value}`" in entry.default, entry.name
            if value and entry.name not in TEST_SECRETS:
                assert Settings.from_environ({**TEST_SECRETS, entry.name: value}) == baseline, entry.name
                shown += 1
    assert shown >= 70


def test_the_built_in_budget_tiers_shown_are_the_catalogues() -> None:
    """The commented-out budget lines of example.env, all set at once, change nothing."""
    lines = [line[1:] for line in example_env().splitlines() if line.startswith("#USER_FEATURE_BUDGET_")]
    environ = dict(line.split("=", 1) for line in lines)
    assert len(environ) == 5 * len(Settings().catalog.budgets)
    assert Settings.from_environ({**TEST_SECRETS, **environ}) == Settings.from_environ(TEST_SECRETS)


def test_the_reference_lists_the_reference_services_names() -> None:
    text = reference_markdown(EXIT_CONFIG)
    for old, rename in RENAMED.items():
        assert f"| `{old}` | `{rename.new}` |" in text
    for old in NOT_READ:
        assert f"| `{old}` |" in text
    assert "| `CLIENT_SECRET` |" in text  # retired here, read by the reference
