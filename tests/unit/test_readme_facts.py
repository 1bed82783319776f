"""The documents' figures and the command line's help texts, checked against the code.

Each fact is taken from its owner (the settings, the parser, the runners, setup.cfg), never
from a list kept here, so a new subcommand, exit status or test folder is checked as well.
Each fact is checked where the documents state it: the README (the front page), the
operator's guide (docs/operations.md), and any variable table in docs/.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import fnmatch
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from mlpa_aiohttp import __main__ as cli
from mlpa_aiohttp.process import startup
from mlpa_aiohttp.settings import DEFAULT_SECRETS, Settings
from mlpa_aiohttp.settings.compat import READ_ELSEWHERE
from mlpa_aiohttp.settings.reference import MARKDOWN_PATH
from tests.support.documented_names import documented_names

from ..conftest import TEST_SECRETS

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
OPERATIONS = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
# Written by hand: the README and every page of docs/ but the generated configuration reference.
HAND_WRITTEN = {
    path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    if path.relative_to(REPO).as_posix() != MARKDOWN_PATH
}


def section(text: str, title: str) -> str:
    """A `## title` section of a document, up to the next second-level heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f'no "{title}" section'
    return match.group(1)


def figure(text: str) -> int:
    return int(text.replace(",", ""))


# -- the listen backlog ------------------------------------------------------------------------


def test_every_backlog_figure_is_the_settings_default() -> None:
    default = Settings.from_environ({}, check_secrets=False).server.listen_backlog
    figures = []
    for text in HAND_WRITTEN.values():
        figures += [figure(m) for m in re.findall(r"backlog of ([\d,]+)", text)]
        figures += [figure(m) for m in re.findall(r"`LISTEN_BACKLOG` \(default ([\d,]+)\)", text)]
        figures += [figure(m) for m in re.findall(r"^\| `LISTEN_BACKLOG` \| `?([\d,]+)`? \|", text, re.MULTILINE)]
    assert len(figures) >= 2, figures
    assert set(figures) == {default}


# -- the configuration ---------------------------------------------------------------------------


def test_the_front_page_and_the_operators_guide_point_at_the_generated_configuration_reference() -> None:
    assert "docs/configuration.md" in README
    assert "(configuration.md)" in OPERATIONS
    assert (REPO / MARKDOWN_PATH).is_file()


def variable_tables(text: str) -> Iterator[tuple[list[str], list[str]]]:
    """(variable names, default literals) of each row of every table whose header starts
    `| variable | default |`; the literals are the values that open the default cell, in
    backticks or bare figures, one per name."""
    in_table = False
    for line in text.splitlines():
        if re.match(r"^\| variable \| default \|", line):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table or not line.startswith("| `"):
            continue
        first, default = [cell.strip() for cell in line.strip("|").split("|")][:2]
        names = re.findall(r"`([A-Z][A-Z0-9_]*[A-Z0-9])`", first)
        literals = re.findall(r"(?:^|, | / )`([^`]*)`", default) or re.findall(r"^(\d+)(?= |$)", default)
        yield names, literals


def test_every_variable_table_agrees_with_the_settings() -> None:
    """Each name in a hand-written variable table is a variable the service reads, and each
    default it spells out reads back as the settings' default."""
    documented = set(documented_names())
    baseline = Settings.from_environ(TEST_SECRETS)
    checked = 0
    for path, text in HAND_WRITTEN.items():
        for names, literals in variable_tables(text):
            assert set(names) <= documented, f"{path} names {set(names) - documented}, which nothing reads"
            if len(literals) != len(names):
                continue  # a default told in words ("unset", "the catalogue's tier")
            for name, literal in zip(names, literals):
                if name in READ_ELSEWHERE:
                    assert literal == READ_ELSEWHERE[name].value, name
                elif name in DEFAULT_SECRETS:
                    assert literal == DEFAULT_SECRETS[name], name  # refused outside MLPA_DEBUG: not read back
                else:
                    assert Settings.from_environ({**TEST_SECRETS, name: literal}) == baseline, f"{path}'s default of {name}"
                checked += 1
    assert checked >= 10


def test_the_variable_table_check_can_fail() -> None:
    rows = list(variable_tables("| variable | default | meaning |\n|---|---|---|\n| `PORT` | `9090` | x |\n"))
    assert rows == [(["PORT"], ["9090"])]
    assert Settings.from_environ({**TEST_SECRETS, "PORT": "9090"}) != Settings.from_environ(TEST_SECRETS)


# -- the subcommands' exit statuses ----------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of `parser` (the CLI's by default); {} for a parser without any."""
    parser = cli.build_parser() if parser is None else parser
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def listed_statuses(help_text: str) -> set[int]:
    block = re.search(r"^exit statuses:\n((?:  \d+ .*\n?)+)", help_text, re.MULTILINE)
    assert block, "no exit statuses in:\n" + help_text
    return {int(line.split()[0]) for line in block.group(1).splitlines()}


def _imports_inside(function: Callable[..., Any], tree: ast.AST) -> dict[str, Any]:
    """Names a function imports in its own body (the CLI imports lazily)."""
    package = importlib.import_module(function.__module__).__package__
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = importlib.import_module("." * node.level + (node.module or ""), package)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(source, alias.name, None)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = importlib.import_module(alias.name.split(".")[0])
    return names


def _resolve(node: ast.expr, scope: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, scope)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


def _is_ours(function: Any) -> bool:
    return inspect.isfunction(function) and function.__module__.startswith("mlpa_aiohttp")


def returnable_statuses(function: Callable[..., Any], seen: set[Any] | None = None) -> set[int]:
    """The exit statuses `function` can return, followed through what it returns: literal
    ints, the startup module's EXIT_* constants, the `exit_code=` of a startup reporter,
    the statuses of a function of ours it returns the result of (also through
    `asyncio.run` / `uvloop.run`), and 78 when it reads the settings (`main` turns a
    SettingsError into the configuration status)."""
    seen = set() if seen is None else seen
    if function in seen:
        return set()
    seen.add(function)
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    scope = {**function.__globals__, **_imports_inside(function, tree)}
    statuses: set[int] = set()

    def of_value(node: ast.expr | None) -> Iterator[int]:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            yield node.value
        elif isinstance(node, (ast.Name, ast.Attribute)):
            value = _resolve(node, scope)
            if type(value) is int:
                yield value
        elif isinstance(node, ast.Call):
            called = _resolve(node.func, scope)
            if called is not None and getattr(called, "__module__", "") == startup.__name__:
                for keyword in node.keywords:
                    if keyword.arg == "exit_code":
                        yield from of_value(keyword.value)
                if called is startup.report_config_error and not any(k.arg == "exit_code" for k in node.keywords):
                    yield startup.EXIT_CONFIG
            elif _is_ours(called):
                yield from returnable_statuses(called, seen)
            elif getattr(called, "__name__", "") == "run" and node.args and isinstance(node.args[0], ast.Call):
                yield from of_value(node.args[0])  # asyncio.run(coro(...)) / uvloop.run(coro(...))
        elif isinstance(node, ast.Await):
            yield from of_value(node.value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Return):
            statuses.update(of_value(node.value))
        elif isinstance(node, ast.Attribute) and node.attr == "from_environ" and _resolve(node.value, scope) is Settings:
            statuses.add(startup.EXIT_CONFIG)
    return statuses


def test_the_status_analysis_sees_what_a_runner_returns() -> None:
    """The analysis below can fail: it finds serve's database and port statuses."""
    assert returnable_statuses(cli._run_serve) >= {0, startup.EXIT_UNAVAILABLE, startup.EXIT_CANNOT_LISTEN, startup.EXIT_CONFIG}


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_each_subcommand_help_lists_exactly_the_statuses_it_can_return(name: str) -> None:
    parser = subcommands()[name]
    # A command with actions of its own (`catalog check`, ...) lists the union of theirs.
    actions = subcommands(parser)
    runners = [action.get_default("run") for action in actions.values()] if actions else [parser.get_default("run")]
    assert None not in runners, f"{name} has no runner"
    # Every command can finish (0) and meet a usage error (2, argparse's).
    for action_name, action in actions.items():
        expected = returnable_statuses(action.get_default("run")) | {0, 2}
        assert listed_statuses(action.format_help()) == expected, f"{name} {action_name}"
    expected = set().union(*(returnable_statuses(runner) for runner in runners)) | {0, 2}
    assert listed_statuses(parser.format_help()) == expected


def test_the_top_level_help_and_the_operators_guide_list_every_status() -> None:
    commands = subcommands()
    every = set().union(*(listed_statuses(p.format_help()) for p in commands.values()))
    assert listed_statuses(cli.build_parser().format_help()) == every
    table = section(OPERATIONS, "Run")
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    # The guide also documents gunicorn's worker-boot status, which no subcommand returns.
    assert documented == every | {startup.GUNICORN_WORKER_BOOT_ERROR}


def test_the_operators_guide_describes_every_subcommand() -> None:
    commands = section(OPERATIONS, "Run")
    described = set(re.findall(r"^\| `([a-z-]+)` \|", commands, re.MULTILINE))
    assert described == set(subcommands())


# -- the test folders of the default run -------------------------------------------------------


def default_run_folders() -> tuple[set[str], set[str]]:
    """(folders the default run collects, folders under testpaths it leaves out), from setup.cfg."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    pytest_config = config["tool:pytest"]
    testpaths = pytest_config["testpaths"].split()
    excluded_patterns = pytest_config["norecursedirs"].split()
    collected, excluded = set(), set()
    for root in testpaths:
        for folder in sorted(p for p in (REPO / root).iterdir() if p.is_dir()):
            relative = folder.relative_to(REPO).as_posix()
            if any(fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(folder.name, pattern) for pattern in excluded_patterns):
                if not folder.name.startswith((".", "_")):
                    excluded.add(relative)  # left out whether or not it holds test files
            elif any(folder.rglob("test_*.py")):
                collected.add(relative)
    return collected, excluded


def readme_opening() -> str:
    """What the README says before its first section: the two commands and what they do."""
    return README.split("\n## ", 1)[0]


def test_the_opening_names_the_folders_of_the_default_run() -> None:
    collected, _ = default_run_folders()
    assert len(collected) >= 3
    tests = readme_opening()
    runs = re.search(r"runs the whole test suite: (.*?), over ", tests, re.DOTALL)
    assert runs, "the README's opening no longer says what the test command runs"
    assert set(re.findall(r"`(tests/[\w/]+)`", runs.group(1))) == collected


def test_the_opening_names_what_the_default_run_leaves_out() -> None:
    _, excluded = default_run_folders()
    assert excluded
    tests = readme_opening()
    for folder in excluded:
        assert re.search(rf"`{re.escape(folder)}`\)\s+are not part of it", tests), folder
