"""The gunicorn master's last good catalogue (docs/catalog.md, "Changing it without cutting
streams").

A worker reads its catalogue once, when it boots, and a HUP boots new workers. Had they read
the operator's `MLPA_CATALOG_FILE` themselves, a broken file would fail every new worker's
boot, and gunicorn's arbiter would then stop the whole service, old workers and their open
streams included. So the master reads the operator's file at start and at each HUP, checks
exactly those bytes, and only then makes them the snapshot: a file in a private directory
the master owns (removed when it exits). Workers are pointed at the snapshot. A file that
fails the check leaves the snapshot as it was: one ERROR listing every problem, and the new
workers serve the last good catalogue. `serve` has no HUP and reads the file directly.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Mapping, MutableMapping

from ..catalog.file import CatalogError, read_catalog_file
from ..observability.logging import log_problems
from ..settings import Settings, catalog_file_path, catalog_file_problem
from .startup import CATALOG_FILE_HINT, json_logs_requested

CATALOG_FILE = "MLPA_CATALOG_FILE"


class CatalogSnapshot:
    """The last good copy of the operator's catalogue file `source`."""

    def __init__(self, source: str) -> None:
        self.source = source
        # mkdtemp: a fresh directory only this user can enter, whatever else is in $TMPDIR.
        self._directory = tempfile.mkdtemp(prefix="mlpa-catalog-")
        self.path = os.path.join(self._directory, "catalog.toml")
        # Forked workers inherit the exit handler; only the master that made the directory
        # removes it.
        self._owner_pid = os.getpid()
        atexit.register(self.remove)

    @classmethod
    def for_environ(cls, environ: Mapping[str, str]) -> "CatalogSnapshot | None":
        """A snapshot of the environment's catalogue file; none for the built-in catalogue."""
        source = catalog_file_path(environ)
        return None if source is None else cls(source)

    def take(self, environ: Mapping[str, str]) -> list[str]:
        """Check the source file, with `environ`'s variables on top, as the service would
        read it; when it passes, it becomes the snapshot. Returns every problem found (none:
        taken); the snapshot is then unchanged."""
        try:
            raw = read_catalog_file(self.source)
        except CatalogError as error:
            return [catalog_file_problem(self.source, problem) for problem in error.problems]
        # The copy is what gets checked, so the snapshot holds exactly the bytes that passed
        # even if the operator's file changes meanwhile.
        candidate = os.path.join(self._directory, "candidate.toml")
        try:
            with open(candidate, "wb") as file:
                file.write(raw)
        except OSError as exc:  # a full disk must not stop the master in the middle of a HUP
            return [catalog_file_problem(self.source, f"cannot copy it to {candidate}: {exc.strerror or exc}")]
        checked = Settings.read_environ(with_catalog_file(environ, candidate), check_secrets=False)
        if checked.problems:
            os.unlink(candidate)
            copy_named, source_named = catalog_file_problem(candidate, ""), catalog_file_problem(self.source, "")
            return [problem.replace(copy_named, source_named, 1) for problem in checked.problems]
        # Atomic: a worker booting now reads the old snapshot or the new one, never half of one.
        os.replace(candidate, self.path)
        return []

    def point_at_snapshot(self, environ: MutableMapping[str, str]) -> None:
        """Make `environ` (a new worker's) read the snapshot instead of the source."""
        for name in [name for name in environ if name.upper() == CATALOG_FILE]:
            del environ[name]
        environ[CATALOG_FILE] = self.path

    def remove(self) -> None:
        if os.getpid() == self._owner_pid:
            shutil.rmtree(self._directory, ignore_errors=True)


def snapshot_for_environ(environ: Mapping[str, str]) -> tuple[CatalogSnapshot | None, list[str]]:
    """The master's snapshot of the environment's catalogue file, taken: none for the
    built-in catalogue; else the snapshot, or the problems that prevent it."""
    try:
        snapshot = CatalogSnapshot.for_environ(environ)
    except OSError as exc:  # gettempdir() too raises when no directory is usable
        return None, [
            f"MLPA_CATALOG_FILE: gunicorn's master cannot make the directory of its copy of the file "
            f"({exc}); set TMPDIR to a writable directory"
        ]
    if snapshot is None:
        return None, []
    problems = snapshot.take(environ)
    if problems:
        snapshot.remove()
        return None, problems
    return snapshot, []


def with_catalog_file(environ: Mapping[str, str], path: str) -> dict[str, str]:
    """`environ` with MLPA_CATALOG_FILE (in whatever case it was spelled) set to `path`."""
    return {**{name: value for name, value in environ.items() if name.upper() != CATALOG_FILE}, CATALOG_FILE: path}


def report_catalog_kept(problems: list[str], environ: Mapping[str, str]) -> None:
    """The start-up message's problem list, at ERROR: the service goes on with the last good
    catalogue."""
    log_problems(
        "catalog_file_refused",
        problems,
        level="error",
        outcome="the last good catalogue is kept",
        hint=CATALOG_FILE_HINT.removeprefix("; "),
        json=json_logs_requested(environ),
        fields={"kept": "the last good catalogue"},
        logger="mlpa_aiohttp.process.catalog_snapshot",
    )
