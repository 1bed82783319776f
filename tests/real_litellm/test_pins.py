"""setup.cfg pins LiteLLM in one place: the proxy the tests run and the migrations `stack` and
the tests apply must be one release's (bumping LiteLLM moves both)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import NOT_INSTALLED, litellm_executable
from .pins import LITELLM_VERSION, SCHEMA_VERSION


def test_the_pinned_litellm_requires_the_pinned_schema_release() -> None:
    executable = litellm_executable()
    if executable is None:
        pytest.skip(NOT_INSTALLED)
    python = Path(executable).parent / "python"
    installed = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm')); print(*m.requires('litellm'), sep='\\n')"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.splitlines()  # fmt: skip
    version, requirements = installed[0], installed[1:]
    assert version == LITELLM_VERSION
    [schema] = [r for r in requirements if r.replace(" ", "").startswith("litellm-proxy-extras")]
    assert schema.split(";")[0].replace(" ", "") == f"litellm-proxy-extras=={SCHEMA_VERSION}"
