"""The configuration reference, made from the settings.

`python -m mlpa_aiohttp config --markdown` prints docs/configuration.md and `config --env`
prints config/example.env, both from the fields of settings/__init__.py: each variable's name, default
and meaning have one owner, its field (a `derived` field's `documents` for the variables its
reader reads), and settings/compat.py for the variables other code reads and the reference
service's names. tests/unit/test_config_reference.py fails when a committed copy is not what
these functions make now.
"""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from collections.abc import Iterator
from dataclasses import Field, dataclass, fields, is_dataclass
from typing import Any, get_type_hints

from ..catalog import BUILTIN_CATALOG, env_name
from . import (
    DEBUG_DEFAULTS,
    DEMO_DEFAULTS,
    Documented,
    Settings,
    Variable,
    field_default,
    field_variable,
)
from .compat import NOT_READ, READ_ELSEWHERE, RENAMED

MARKDOWN_PATH = "docs/configuration.md"
ENV_PATH = "config/example.env"
COMMAND = "python -m mlpa_aiohttp config"
MARKDOWN_COMMAND = f"{COMMAND} --markdown > {MARKDOWN_PATH}"
ENV_COMMAND = f"{COMMAND} --env > {ENV_PATH}"

# The `<TYPE>` of a budget variable's name stands for each service type of the catalogue.
TYPE_PLACEHOLDER = "<TYPE>"
ENV_WIDTH = 96


@dataclass(frozen=True, slots=True)
class Entry:
    """One variable as the reference shows it."""

    name: str
    # For people (Markdown): the default, and what the demo, MLPA_DEBUG or the secret rules change.
    default: str
    # What the variable accepts (Markdown).
    accepts: str
    meaning: str
    # The value that spells the default in an env file; None: the line is commented out.
    env_value: str | None
    # The value a commented-out env line shows ("" for none).
    env_example: str = ""
    secret: bool = False
    # A secret whose default start-up refuses outside MLPA_DEBUG and the demo.
    refused: bool = False
    # A budget tier field: one variable per service type of the catalogue.
    tier_field: str | None = None


@dataclass(frozen=True, slots=True)
class Section:
    heading: str
    intro: str
    entries: tuple[Entry, ...]


def sections() -> tuple[Section, ...]:
    """The settings' variables by section, in the order they are read, then the variables
    other code reads."""
    found = []
    hints = get_type_hints(Settings)
    for spec in fields(Settings):
        var = field_variable(spec)
        if var is not None:
            assert var.heading, f"Settings.{spec.name} needs a heading for the reference"
            found.append(Section(var.heading, "", tuple(_entries(spec, hints[spec.name], var, Settings))))
            continue
        assert is_dataclass(hints[spec.name]), spec.name
        section = hints[spec.name]  # a section dataclass (its `heading` is a ClassVar)
        section_hints = get_type_hints(section)
        entries: list[Entry] = []
        for inner in fields(section):
            inner_var = field_variable(inner)
            if inner_var is not None:
                entries.extend(_entries(inner, section_hints[inner.name], inner_var, section))
        found.append(Section(section.heading, _docstring(section), tuple(entries)))
    elsewhere = tuple(
        Entry(name, spec.default, spec.accepts, f"{spec.meaning} Read by {spec.reader}.", spec.value)
        for name, spec in READ_ELSEWHERE.items()
    )
    found.append(Section("Read by other code", "Variables that gunicorn's config file and the libraries read.", elsewhere))
    return tuple(found)


def _docstring(section: type) -> str:
    return " ".join((inspect.getdoc(section) or "").split())


def _entries(spec: Field[Any], kind: Any, var: Variable, section: type) -> Iterator[Entry]:
    if var.read is not None:
        yield from (_documented(doc) for doc in var.documents)
        return
    assert var.name is not None and var.meaning, f"{var.name or spec.name} needs a meaning"
    secret = not spec.repr
    value = _env_text(field_default(spec), var)
    if value is None:
        default = "unset"
    elif value == "":
        default = "empty"
    else:
        default = f"`{value}`"
    commented = value is None or bool(var.follows) or var.name in DEMO_DEFAULTS or var.name in DEBUG_DEFAULTS
    if var.follows:
        default = f"`{_variable_of(section, var.follows)}`'s value"
    if var.name in DEMO_DEFAULTS:
        default += f" (`{_env_text(DEMO_DEFAULTS[var.name], var)}` in the demo)"
    if var.name in DEBUG_DEFAULTS:
        default += f" (`{_env_text(DEBUG_DEFAULTS[var.name], var)}` with `MLPA_DEBUG`)"
    if var.refused_default:
        default += " (*refused*)"
    yield Entry(
        var.name,
        default,
        _accepts(kind, var, secret),
        var.meaning,
        None if commented else value,
        env_example=value or "",
        secret=secret,
        refused=var.refused_default,
    )


def _documented(doc: Documented) -> Entry:
    return Entry(doc.name, doc.default, doc.accepts, doc.meaning, doc.value, tier_field=doc.tier_field)


def _variable_of(section: type, field_name: str) -> str:
    [spec] = [spec for spec in fields(section) if spec.name == field_name]
    var = field_variable(spec)
    assert var is not None and var.name is not None
    return var.name


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _env_text(value: Any, var: Variable | None = None) -> str | None:
    """`value` as an env file spells it (read back, it is `value`); None for None."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, frozenset):
        return json.dumps(sorted(value), separators=(",", ":")) if value else ""
    if isinstance(value, float):
        return _number(value)
    if var is not None and var.choices:
        return str(value).lower()
    return str(value)


def _accepts(kind: Any, var: Variable, secret: bool) -> str:
    if var.choices:
        text = "one of " + ", ".join(f"`{choice.lower()}`" for choice in var.choices)
    elif kind is bool:
        text = "boolean"
    elif kind is int:
        text = "integer"
    elif kind is float or kind == float | None:
        text = "number"
    elif kind == frozenset[str]:
        text = "list"
    else:
        text = "text"
    if var.minimum is not None:
        text += f" ≥ {_number(var.minimum)}"
    return text + (", **secret**" if secret else "")


# --- Markdown -------------------------------------------------------------------------------


def reference_markdown(config_error_exit: int) -> str:
    """docs/configuration.md; `config_error_exit` is the exit status of a configuration error
    (the command line's, passed in: the settings know no process)."""
    all_sections = sections()
    lines = [
        "# Configuration",
        "",
        "<!-- Made from mlpa_aiohttp/settings/__init__.py: edit the settings, then run",
        f"     {MARKDOWN_COMMAND} -->",
        "",
        "Every environment variable the service reads, with its default and meaning, by section.",
        f"[`{ENV_PATH}`](../{ENV_PATH}) has them as an env file ready to copy (`{COMMAND} --env`).",
        "",
        "* Names are case-insensitive. Booleans accept `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`;",
        "  lists accept a JSON list of strings or a comma-separated list. An empty number, boolean or",
        "  list is its default.",
        "* Start-up checks every value and stops on invalid ones with one message that lists them all",
        f"  (exit status {config_error_exit}), with every name set that is close to a known one but not one",
        "  (`LOG_LEVLE`: did you mean `LOG_LEVEL`?). With a valid configuration such a name is a",
        "  `setting_unknown` WARNING.",
        "* Variables marked **secret** belong in the Kubernetes Secret; their values never reach the",
        "  logs or Sentry. Outside `MLPA_DEBUG=true` and the demo, start-up refuses a secret whose",
        "  default is marked *refused* while it is unset, empty or still that default.",
        "",
        " · ".join(f"[{section.heading}](#{_anchor(section.heading)})" for section in all_sections)
        + f" · [{REFERENCE_HEADING}](#{_anchor(REFERENCE_HEADING)})",
    ]
    for section in all_sections:
        lines += ["", f"## {section.heading}", ""]
        if section.intro:
            lines += [*textwrap.wrap(section.intro, ENV_WIDTH), ""]
        lines += ["| variable | default | accepts | meaning |", "|---|---|---|---|"]
        for entry in section.entries:
            lines.append(f"| `{entry.name}` | {entry.default} | {entry.accepts} | {_cell(entry.meaning)} |")
        if any(entry.tier_field for entry in section.entries):
            lines += ["", *_tier_table(section.entries)]
    lines += ["", *_reference_names()]
    return "\n".join(lines) + "\n"


REFERENCE_HEADING = "Variables of the reference service"


def _reference_names() -> list[str]:
    lines = [
        f"## {REFERENCE_HEADING}",
        "",
        "A configuration carried over from the reference (FastAPI MLPA) keeps working. Its renamed",
        "variables are read as their new names (the new name wins when both are set), each with one",
        "`setting_renamed` WARNING at start-up:",
        "",
        "| reference name | read as | reference default | new default | note |",
        "|---|---|---|---|---|",
    ]
    for old, rename in RENAMED.items():
        lines.append(
            f"| `{old}` | `{rename.new}` | `{rename.reference_default}` | `{rename.new_default}` | {_cell(rename.note)} |"
        )
    lines += [
        "",
        "These are no longer read; each one set gets a `setting_not_read` WARNING with the reason:",
        "",
        "| reference name | why |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {_cell(reason)} |" for name, reason in NOT_READ.items()]
    return lines


def _tier_table(entries: tuple[Entry, ...]) -> list[str]:
    tiered = [entry for entry in entries if entry.tier_field]
    lines = [
        f"`{TYPE_PLACEHOLDER}` is a service type of the catalogue, upper-cased, `-` written `_`. Each variable",
        "set replaces that value of the type's tier in the catalogue; the built-in tiers:",
        "",
        "| service type | " + " | ".join(f"`…_{entry.name.rsplit(TYPE_PLACEHOLDER + '_', 1)[1]}`" for entry in tiered) + " |",
        "|---|" + "---|" * len(tiered),
    ]
    for service_type, tier in BUILTIN_CATALOG.budgets.items():
        values = [_env_text(getattr(tier, entry.tier_field)) for entry in tiered if entry.tier_field]
        lines.append(f"| `{service_type}` (`{env_name(service_type)}`) | " + " | ".join(f"`{v}`" for v in values) + " |")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _anchor(heading: str) -> str:
    """The fragment GitHub gives a heading."""
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


# --- env file -------------------------------------------------------------------------------


def example_env() -> str:
    """config/example.env."""
    lines = [
        "# mlpa-aiohttp: every environment variable, with its default.",
        "# Made from mlpa_aiohttp/settings/__init__.py: edit the settings, then run",
        f"#     {ENV_COMMAND}",
        f"# {MARKDOWN_PATH} is the same list with what each variable accepts.",
        "# A commented-out line is unset by default. SECRET lines show the documented development",
        "# defaults; start-up refuses those that say so unless MLPA_DEBUG=true.",
        "# Use: docker run --env-file config/example.env ...; or copy to .env and edit.",
    ]
    for section in sections():
        lines += ["", f"# === {section.heading} ==="]
        tiered = [entry for entry in section.entries if entry.tier_field]
        for entry in section.entries:
            if not entry.tier_field:
                lines += _env_lines(entry)
            elif entry is tiered[0]:
                lines += _tier_lines(tiered)
    return "\n".join(lines) + "\n"


def _tier_lines(tiered: list[Entry]) -> list[str]:
    """The budget variables of each service type of the built-in catalogue, commented out
    with the catalogue's values (which apply while they are unset)."""
    lines = _comment(
        f"Budget tiers, {tiered[0].name.split(TYPE_PLACEHOLDER)[0]}{TYPE_PLACEHOLDER}_*: each one set replaces"
        " that value of the catalogue's tier; unset, the catalogue's value (shown) applies."
    )
    for service_type, tier in BUILTIN_CATALOG.budgets.items():
        for entry in tiered:
            assert entry.tier_field is not None
            name = entry.name.replace(TYPE_PLACEHOLDER, env_name(service_type))
            lines += [*_comment(f"{service_type}: {entry.meaning}"), f"#{name}={_env_text(getattr(tier, entry.tier_field))}"]
    return lines


def _env_lines(entry: Entry) -> list[str]:
    text = ("SECRET. " if entry.secret else "") + entry.meaning
    if entry.refused:
        text += " This default is refused outside MLPA_DEBUG and the demo."
    if entry.env_value is None and entry.default != "unset":
        text += f" Unset: {entry.default.replace('`', '')}."
    assignment = f"{entry.name}={entry.env_value}" if entry.env_value is not None else f"#{entry.name}={entry.env_example}"
    return [*_comment(text), assignment]


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, ENV_WIDTH, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)
