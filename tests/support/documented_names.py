"""The variable names the configuration reference documents, as its readers would count them:
each entry of its sections, a `<TYPE>` entry once per service type of the built-in catalogue."""

from __future__ import annotations

from mlpa_aiohttp.catalog import BUILTIN_CATALOG
from mlpa_aiohttp.settings.reference import TYPE_PLACEHOLDER, sections


def documented_names() -> list[str]:
    """In the reference's order; a name twice is a mistake the tests look for."""
    names = []
    for section in sections():
        for entry in section.entries:
            if TYPE_PLACEHOLDER in entry.name:
                names += [entry.name.replace(TYPE_PLACEHOLDER, infix) for infix in BUILTIN_CATALOG.budget_infixes.values()]
            else:
                names.append(entry.name)
    return names
