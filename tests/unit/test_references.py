"""Every reference to the compatibility contract resolves inside the repository.

Code, tests and docs cite `docs/compatibility.md` by section (the reference's topics, e.g.
"compatibility.md §4.5") and by difference ("compatibility.md D16"). Each cited name must be
a heading of that page, and no reference may point at a document the repository does not
hold (the team's behaviour description or its list of decisions, by their old forms).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "docs" / "compatibility.md"
SEARCHED = ("mlpa_aiohttp", "tests", "docs", "README.md", "config")
TEXT_SUFFIXES = {
    ".py", ".md", ".txt", ".toml", ".yml", ".yaml", ".env", ".cfg", ".ini", ".sql",
    ".html", ".js", ".css", ".json", ".sh", ".conf", ".j2", ".tmpl",
}

NAME = r"(?:§\d+(?:\.\d+)*|D\d+)"
SEPARATOR = r"(?:, and |, | and | or |; |/)"
CHAIN = re.compile(rf"compatibility\.md ({NAME}(?:{SEPARATOR}{NAME})*)")
HEADING = re.compile(rf"^#{{2,6}} ({NAME})(?= |$)", re.MULTILINE)
SECTION_SIGN = re.compile(r"§\d")
# A section sign that cites another document (an RFC, a named file) is not ours.
OTHER_DOCUMENT_BEFORE = re.compile(r"(?:RFC \d+ |\.md`? |\.md\)? )$")
STALE_FORMS = {
    "spec section": re.compile(r"\b[Ss]pec\s+§"),
    "numbered decision": re.compile(r"\b[Dd]ecisions?\s+\d"),
    "document outside the repository": re.compile(r"\b(?:decisions|mlpa-behaviour)\.md"),
}


def contract_names() -> list[str]:
    return HEADING.findall(CONTRACT.read_text(encoding="utf-8"))


def repository_texts():
    for root in SEARCHED:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for candidate in candidates:
            relative = candidate.relative_to(REPO)
            if not candidate.is_file() or candidate.suffix not in TEXT_SUFFIXES:
                continue
            if candidate == CONTRACT or any(p.startswith(".") or p == "__pycache__" for p in relative.parts):
                continue
            try:
                yield relative, candidate.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def cited_names(chain: str) -> list[str]:
    return re.findall(NAME, chain)


def test_contract_headings_are_unique_and_differences_numbered_without_gaps():
    names = contract_names()
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    differences = sorted(int(n[1:]) for n in names if n.startswith("D"))
    assert differences, "docs/compatibility.md has no D headings"
    assert differences == list(range(1, differences[-1] + 1))
    # Written without the section sign so that the rewrite leaves this list alone.
    for topic in ("1.1", "2.1", "3.2", "4.5", "5.1", "6", "8.2", "11.11"):
        assert "\N{SECTION SIGN}" + topic in names


def test_every_reference_into_the_contract_resolves():
    names = set(contract_names())
    unresolved = []
    references = 0
    for relative, text in repository_texts():
        for match in CHAIN.finditer(text):
            for name in cited_names(match.group(1)):
                references += 1
                if name not in names:
                    unresolved.append(f"{relative}:{line_of(text, match.start())}: {name}")
    assert references > 50, "the repository should cite the contract throughout"
    assert not unresolved, "\n".join(unresolved)


def test_the_contract_itself_cites_only_its_own_headings():
    names = set(contract_names())
    text = CONTRACT.read_text(encoding="utf-8")
    cited = set(re.findall(rf"(?<![\w.]){NAME}(?![\w])", text))
    assert cited - names == set()


def test_no_section_sign_outside_a_contract_reference():
    """A section sign with no document before it leaves the reader guessing which one it means."""
    stray = []
    for relative, text in repository_texts():
        spans = [m.span() for m in CHAIN.finditer(text)]
        for match in SECTION_SIGN.finditer(text):
            start = match.start()
            if any(a <= start < b for a, b in spans):
                continue
            if OTHER_DOCUMENT_BEFORE.search(text[max(0, start - 60):start]):
                continue
            stray.append(f"{relative}:{line_of(text, start)}: {text[start:start + 12]!r}")
    assert not stray, "\n".join(stray)


@pytest.mark.parametrize("form", sorted(STALE_FORMS))
def test_no_reference_to_documents_outside_the_repository(form):
    pattern = STALE_FORMS[form]
    found = [
        f"{relative}:{line_of(text, m.start())}: {text[m.start():m.start() + 30]!r}"
        for relative, text in repository_texts()
        for m in pattern.finditer(text)
    ]
    assert not found, "\n".join(found)


# -- links between the documents ---------------------------------------------------------------
#
# Every relative link in README.md and docs/ resolves: to a file or folder of the repository,
# and, with a fragment, to a heading of that document, as GitHub renders it.

DOCUMENTS = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
ATX_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose(markdown: str) -> str:
    """The text links can live in: fenced blocks and code spans blanked (kept as newlines, so
    line numbers still count)."""
    blank = lambda match: re.sub(r"[^\n]", " ", match.group(0))  # noqa: E731
    return INLINE_CODE.sub(blank, FENCE.sub(blank, markdown))


def heading_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower case, punctuation other than
    `-` and `_` dropped, each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    # Code spans keep their text as written; elsewhere emphasis marks go.
    parts = re.split(r"(`+[^`]*`+)", text)
    text = "".join(part.strip("`") if part.startswith("`") else re.sub(r"\*|(?<!\w)_|_(?!\w)", "", part) for part in parts)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The fragments a document answers: one per heading (repeats get -1, -2, ...), and any
    explicit `<a id=...>`."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    headings = ATX_HEADING.findall(FENCE.sub("", markdown))
    for heading in headings:
        slug = heading_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found | set(HTML_ANCHOR.findall(markdown))


def broken_links(document: Path, markdown: str) -> list[str]:
    problems = []
    text = prose(markdown)
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # https:, mailto:: not ours to resolve
        where = f"{document.relative_to(REPO)}:{line_of(text, match.start())}: {target}"
        path_part, _, fragment = target.partition("#")
        if not path_part:
            if fragment not in anchors(markdown):
                problems.append(f"{where}: no heading #{fragment} here")
            continue
        resolved = (document.parent / path_part).resolve()
        if not resolved.exists():
            problems.append(f"{where}: no such file")
            continue
        if REPO not in resolved.parents and resolved != REPO:
            problems.append(f"{where}: outside the repository")
            continue
        if fragment:
            if resolved.suffix != ".md":
                problems.append(f"{where}: a fragment into a file that is not markdown")
            elif fragment not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{where}: no heading #{fragment} in {resolved.relative_to(REPO)}")
    return problems


def test_the_link_check_finds_broken_files_and_anchors() -> None:
    """The check below can fail: a missing file, a missing heading, a link in code is ignored."""
    document = REPO / "docs" / "example.md"
    markdown = (
        "# Title\n\n## A `_code` heading, with (punctuation) and _emphasis_\n\n## Repeated\n\n## Repeated\n\n"
        "[ok](#a-_code-heading-with-punctuation-and-emphasis) [ok](#repeated-1) [ok](../README.md) [ok](https://x.invalid/)\n"
        "[gone](no-such-file.md) [bad anchor](#no-such-heading) [bad anchor](../README.md#no-such-heading)\n"
        "`[in code](nowhere.md)`\n\n```\n[in a fence](nowhere.md)\n```\n"
    )
    problems = broken_links(document, markdown)
    assert problems == [
        "docs/example.md:10: no-such-file.md: no such file",
        "docs/example.md:10: #no-such-heading: no heading #no-such-heading here",
        "docs/example.md:10: ../README.md#no-such-heading: no heading #no-such-heading in README.md",
    ]


def test_every_relative_link_in_the_documents_resolves() -> None:
    problems = []
    links = 0
    for document in DOCUMENTS:
        markdown = document.read_text(encoding="utf-8")
        links += len(LINK.findall(prose(markdown)))
        problems += broken_links(document, markdown)
    assert links > 30, "the documents should link to each other"
    assert not problems, "\n".join(problems)


# -- paths the documents name ------------------------------------------------------------------
#
# A module moved or renamed leaves the documents naming it behind: every repository path a
# document writes in a code span must exist. docs/architecture.md writes package paths
# without `mlpa_aiohttp/` (its rows name modules by file); the other pages start a path at
# the repository's root or at one of the package's subpackages. `relay/ending.record` names
# the module `relay/ending.py`.

PACKAGE = REPO / "mlpa_aiohttp"
ROOT_FOLDERS = ("mlpa_aiohttp/", "tests/", "config/", "docs/", ".ci/")
CODE_SPAN = re.compile(r"`([\w./-]+)`")
FILE_SUFFIX = re.compile(r"\.(?:py|md|ya?ml|toml|json|env|sql|cfg|csv|png|mjs|lock|html|pem)$")


def subpackages() -> tuple[str, ...]:
    return tuple(f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def missing_paths(document: Path, markdown: str) -> list[str]:
    architecture = document.name == "architecture.md"
    missing = []
    for match in CODE_SPAN.finditer(FENCE.sub("", markdown)):
        token = match.group(1)
        in_package = token.startswith(subpackages()) or (architecture and token.endswith(".py") and "/" not in token)
        if not (token.startswith(ROOT_FOLDERS) or in_package):
            continue
        base = REPO if token.startswith(ROOT_FOLDERS) else PACKAGE
        module = re.sub(r"\.\w+(?:\.\w+)*$", "", token)  # `relay/ending.record` -> relay/ending
        candidates = [token] if FILE_SUFFIX.search(token) or token.endswith("/") else [token, f"{module}.py", module]
        if not any((base / path).exists() for path in candidates):
            missing.append(f"{document.relative_to(REPO)}: `{token}`")
    return missing


def test_the_path_check_finds_a_moved_module() -> None:
    architecture = REPO / "docs" / "architecture.md"
    text = "`app.py` `relay/ending.record` `tests/unit/` `gone.py` `relay/gone.Thing` `config/gone.yaml` `web.AppKey`"
    assert missing_paths(architecture, text) == [
        "docs/architecture.md: `gone.py`",
        "docs/architecture.md: `relay/gone.Thing`",
        "docs/architecture.md: `config/gone.yaml`",
    ]
    # Outside architecture.md a bare file name is not taken for a package path.
    assert missing_paths(REPO / "docs" / "example.md", "`gone.py` `relay/gone.py`") == ["docs/example.md: `relay/gone.py`"]


def test_every_path_the_documents_name_exists() -> None:
    missing = [problem for document in DOCUMENTS for problem in missing_paths(document, document.read_text(encoding="utf-8"))]
    assert not missing, "\n".join(missing)


# -- current reference, not a journal ----------------------------------------------------------
#
# History lives in git: the documents name no issue, no benchmark round. Program output in a
# fenced block may hold a `#1` of its own (the catalogue's error messages number entries).

JOURNAL_MARKERS = re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w&])#\d+\b|\b[Rr]ounds? \d+")


def journal_markers(markdown: str) -> list[str]:
    text = FENCE.sub("", markdown)
    return [f"{line_of(text, m.start())}: {m.group(0)!r}" for m in JOURNAL_MARKERS.finditer(text)]


def test_the_journal_check_finds_issue_numbers_and_rounds() -> None:
    text = "As issue 12 found, round 5 (#24) ...\n```\nservice_type #1 'ai'\n```\nsee compatibility.md D16 and §4.5"
    assert journal_markers(text) == ["1: 'issue 12'", "1: 'round 5'", "1: '#24'"]


def test_no_document_is_a_journal() -> None:
    found = [
        f"{document.relative_to(REPO)}:{marker}"
        for document in DOCUMENTS
        for marker in journal_markers(document.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)


def test_the_index_links_every_page() -> None:
    """docs/README.md indexes the pages by reader: a new page is added there too."""
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in LINK.findall(prose(index))}
    pages = {path.name for path in (REPO / "docs").glob("*.md") if path.name != "README.md"}
    assert not pages - linked, f"pages docs/README.md does not index: {sorted(pages - linked)}"


# -- length --------------------------------------------------------------------------------------
#
# The front page and the figures stay short enough to be read whole: what does not fit
# belongs in a page of its own (docs/README.md says which reader it serves).
MOST_LINES = {"README.md": 250, "docs/performance.md": 300}


@pytest.mark.parametrize("page", sorted(MOST_LINES))
def test_the_front_page_and_the_figures_stay_short(page: str) -> None:
    lines = len((REPO / page).read_text(encoding="utf-8").splitlines())
    assert lines <= MOST_LINES[page], f"{page} has {lines} lines, more than {MOST_LINES[page]}"
