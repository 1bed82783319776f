"""Starting the real LiteLLM proxy on loopback, shared by the suite's fixture and the
capture script: where its executable is, the environment it runs in, its start-up.

LiteLLM is looked up as `MLPA_LITELLM_BIN`, else `<repo>/.venv-litellm/bin/litellm` (made by
.ci/run with setup.cfg's `real-litellm` pin), else `litellm` beside this Python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.fake_provider import Behaviour

from .pins import LITELLM_VERSION

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
# LiteLLM model group -> the provider behaviour its deployment asks for: the groups both the
# suite and the capture script configure (each adds its own).
MODEL_GROUPS: dict[str, Behaviour] = {
    "ok-model": Behaviour.OK,
    "slow-model": Behaviour.SLOW,
    "ratelimit-model": Behaviour.RATE_LIMIT,
    "throttle-model": Behaviour.THROTTLE,
    "ctx-model": Behaviour.CONTEXT,
    "badparam-model": Behaviour.BAD_PARAM,
    "e500-model": Behaviour.SERVER_ERROR,
    "midstream-model": Behaviour.MID_STREAM,
    "priced-model": Behaviour.OK,  # with a price per token: LiteLLM reports the cost
}
NOT_INSTALLED = (
    "real LiteLLM not installed (python3 -m venv .venv-litellm && "
    ".venv-litellm/bin/pip install $(python3 tests/real_litellm/pins.py real-litellm))"
)


@dataclass
class RealLiteLLM:
    process: subprocess.Popen
    base_url: str
    log_path: Path
    started_in: float

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def litellm_executable() -> str | None:
    override = os.environ.get("MLPA_LITELLM_BIN")
    if override:
        return override if Path(override).is_file() else None
    for candidate in (REPO_ROOT / ".venv-litellm" / "bin" / "litellm", Path(sys.executable).parent / "litellm"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which("litellm")


def launch_litellm(executable: str, config: dict[str, Any], workdir: Path, port: int, **extra_env: str) -> RealLiteLLM:
    """Start LiteLLM with `config` in `workdir` (its log there too); the caller waits for it
    to answer and stops it. `litellm_hooks.py` is importable by the config's callbacks."""
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    shutil.copy(HERE / "litellm_hooks.py", workdir / "litellm_hooks.py")
    # Nothing of this machine's own LiteLLM or database settings leaks in.
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DATABASE_", "LITELLM_", "PROMETHEUS_")) and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        {
            "PYTHONPATH": str(workdir),  # the config's callback module
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price map at start
            "LITELLM_LOG": "ERROR",
            **extra_env,
        }
    )
    log_path = workdir / "litellm.log"
    with log_path.open("wb") as log_file:  # the child holds its own descriptor
        process = subprocess.Popen(
            [executable, "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port), "--telemetry", "False"],
            cwd=workdir,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return RealLiteLLM(process, f"http://127.0.0.1:{port}", log_path, 0.0)
