"""The LiteLLM this project is tested against, as pinned in setup.cfg (its one place): the
proxy (extra `real-litellm`) and its database migrations (extra `stack`).

    python3 tests/real_litellm/pins.py real-litellm   # prints litellm[proxy]==X.Y.Z (.ci/run)

Standard library only: .ci/run reads it before any venv exists.
"""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


def extra_requirements(extra: str) -> list[str]:
    """The requirement lines of one of setup.cfg's extras, comments and blanks left out."""
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG, encoding="utf-8")
    text = parser.get("options.extras_require", extra)
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def pinned(extra: str, project: str) -> str:
    """`project`'s `==` pin in `extra`, e.g. pinned("real-litellm", "litellm") -> "1.106.12"."""
    for requirement in extra_requirements(extra):
        name, _, version = requirement.partition("==")
        if name.split("[", 1)[0].strip().lower() == project:
            return version.strip()
    raise LookupError(f"setup.cfg's extra {extra!r} pins no {project!r}")


LITELLM_VERSION = pinned("real-litellm", "litellm")
SCHEMA_VERSION = pinned("stack", "litellm-proxy-extras")

if __name__ == "__main__":
    print("\n".join(extra_requirements(sys.argv[1])))
