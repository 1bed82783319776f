"""The rules of docs/architecture.md ("Rules a change keeps") that code can check, read from
the package's source with `ast` (nothing is imported): the layers (the order is parsed from
the page itself, so page and check cannot drift apart), who imports `aiohttp.web`, and who
reads the environment."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mlpa_aiohttp"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Below routes/ and relay/, the modules allowed to import aiohttp.web (architecture.md).
WEB_IMPORTERS_BELOW_ROUTES = {
    "keys.py",  # the web.AppKeys
    "observability/sentry.py",  # its aiohttp integration
    "process/overload.py",  # its shedding middleware
}
# The fakes are HTTP servers, the demo's and stack's upstreams: web is what they are made of.
WEB_LAYERS_ABOVE = {"__main__", "app", "middlewares", "routes/", "relay/", "testing/"}
# The modules that read the environment (architecture.md, "The environment is read at the entry points only").
ENVIRONMENT_READERS = {
    "app.py",  # app_factory, gunicorn's entry
    "__main__.py",  # the command line
    "process/gunicorn_worker.py",  # a start-up error reporter: names the variables a problem came from
    "observability/metrics.py",  # prometheus_client switches to multiprocess mode on the variable itself
    "testing/stack.py",  # the `stack` command's database part
}


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def layer_of(relative: str) -> str:
    first = relative.split("/", 1)
    return first[0] + "/" if len(first) == 2 else first[0].removesuffix(".py")


def documented_layers() -> list[set[str]]:
    text = " ".join(ARCHITECTURE.read_text().split())
    rule = re.search(r"\*\*Imports run downwards\*\*, layer by layer: (.+?)\. Nothing imports upwards", text)
    assert rule, "docs/architecture.md no longer states the layers"
    return [set(re.findall(r"`([^`]+)`", part)) for part in rule.group(1).split("→")]


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imported_modules(relative: str, tree: ast.Module) -> Iterator[str]:
    """Every module of the package `relative` imports (dotted, under mlpa_aiohttp), outside
    `if TYPE_CHECKING:` blocks."""
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    here = ["mlpa_aiohttp", *relative.removesuffix(".py").split("/")]
    package = here if relative.endswith("__init__.py") else here[:-1]
    if relative.endswith("__init__.py"):
        package = here[:-1]
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("mlpa_aiohttp"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("mlpa_aiohttp"):
                target = node.module
            else:
                continue
            yield target
            if not node.module or node.level:
                yield from (f"{target}.{alias.name}" for alias in node.names)


def file_of(dotted: str) -> str | None:
    parts = dotted.split(".")[1:]
    if not parts:
        return None  # the package's own __init__ (its version): below everything
    path = PACKAGE.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py").relative_to(PACKAGE).as_posix()
    if (path / "__init__.py").is_file():
        return (path / "__init__.py").relative_to(PACKAGE).as_posix()
    return None  # a name imported from a module, not a module


def test_every_module_belongs_to_a_documented_layer() -> None:
    known = set().union(*documented_layers())
    missing = {layer_of(relative) for relative, _ in modules()} - known - {"__init__"}
    assert not missing, f"docs/architecture.md's layers do not place: {sorted(missing)}"


def test_imports_run_downwards() -> None:
    rank = {name: index for index, layer in enumerate(documented_layers()) for name in layer}
    upward = []
    for relative, tree in modules():
        own = rank.get(layer_of(relative))
        if own is None:
            continue
        for dotted in set(imported_modules(relative, tree)):
            target = file_of(dotted)
            if target is None:
                continue
            theirs = rank.get(layer_of(target))
            if theirs is not None and theirs < own:
                upward.append(f"{relative} imports {target}")
    assert not upward, "imports that run upwards (docs/architecture.md):\n" + "\n".join(sorted(upward))


def test_only_the_named_modules_below_routes_import_aiohttp_web() -> None:
    importers = set()
    for relative, tree in modules():
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else
                [f"{node.module}.{alias.name}" for alias in node.names] if isinstance(node, ast.ImportFrom) and node.module else []
            )  # fmt: skip
            if any(name == "aiohttp.web" or name.startswith(("aiohttp.web.", "aiohttp.web_")) for name in names):
                importers.add(relative)
    below = {relative for relative in importers if layer_of(relative) not in WEB_LAYERS_ABOVE}
    assert below == WEB_IMPORTERS_BELOW_ROUTES


def test_only_the_entry_points_read_the_environment() -> None:
    readers = set()
    for relative, tree in modules():
        for node in ast.walk(tree):
            is_os = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
            if is_os and node.attr in {"environ", "getenv"}:  # type: ignore[union-attr]
                readers.add(relative)
    assert readers == ENVIRONMENT_READERS
