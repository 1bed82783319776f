"""`python -m mlpa_aiohttp stack` without a reachable database: one clear message, exit 1."""

from __future__ import annotations

import os
import subprocess
import sys

from mlpa_aiohttp.settings import variable_names
from tests.support.processes import free_port


def test_stack_without_a_database_says_what_to_fix(tmp_path) -> None:
    env = {name: value for name, value in os.environ.items() if name not in variable_names()}
    env.update(DB_HOST="127.0.0.1", DB_PORT=str(free_port()))  # nothing listens there
    env_file = tmp_path / "stack.env"
    result = subprocess.run(
        [sys.executable, "-m", "mlpa_aiohttp", "stack", "--env-file", str(env_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result
    assert "DEVELOPMENT ONLY" in result.stderr
    assert f"cannot prepare LiteLLM's schema on PostgreSQL at 127.0.0.1:{env['DB_PORT']}" in result.stderr
    assert "CREATEDB" in result.stderr
    assert "Traceback" not in result.stderr
    assert not env_file.exists()
