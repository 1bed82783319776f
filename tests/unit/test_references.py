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
