"""README "Running it for real", followed literally: its `sh <terminal>` blocks are parsed
from the README and run as written against a throwaway PostgreSQL, up to a streamed
completion through gunicorn. Only the variables the blocks themselves read are set
(`PSQL`, `DB_HOST`, `DB_PORT`, `PORT`); the `install` block is the venv this test runs in,
linked as `.venv` into a directory laid out like the clone (`config/`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

import pytest
import requests

from mlpa_aiohttp.settings import variable_names
from mlpa_aiohttp.testing.fake_litellm import completion_text
from tests.support.postgres import ThrowawayPostgres
from tests.support.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION_HEADING = "## Running it for real"
TERMINALS = ("install", "superuser", "terminal-1", "terminal-2", "terminal-3")
BLOCK = re.compile(r"^```sh (?P<terminal>[a-z0-9-]+)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
STACK_CHUNKS = 20
# A warning or error line in any log format (structlog console or JSON, gunicorn's own).
PROBLEM_LINE = re.compile(
    r"\[(warning|error|critical)\s*\]|\"level\":\s*\"(warning|error|critical)\"|\b(WARNING|ERROR|CRITICAL)\b"
)  # the stack's fake LiteLLM streams this many content chunks


def readme_terminals(readme: str) -> dict[str, str]:
    """The section's `sh <terminal>` blocks, each terminal's blocks joined in order."""
    start = readme.index(SECTION_HEADING + "\n")
    end = readme.find("\n## ", start + 1)
    section = readme[start : end if end != -1 else len(readme)]
    terminals: dict[str, str] = {}
    for match in BLOCK.finditer(section):
        terminals[match["terminal"]] = terminals.get(match["terminal"], "") + match["body"]
    return terminals


@dataclass
class Terminal:
    """A long-running block (Ctrl-C ends it), its output in a file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def assert_running(self) -> None:
        assert self.process.poll() is None, f"{self.name} exited ({self.process.returncode}):\n{self.output()}"

    def interrupt(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log_file.close()
        return self.process.returncode


def bash(script: str) -> list[str]:
    return ["bash", "-e", "-u", "-o", "pipefail", "-c", script]


@pytest.fixture
def clone_dir(tmp_path: Path) -> Path:
    if sys.prefix == sys.base_prefix:
        pytest.skip("the README's commands use .venv: run the tests from a virtual environment")
    workdir = tmp_path / "clone"
    workdir.mkdir()
    (workdir / "config").symlink_to(REPO_ROOT / "config")
    (workdir / ".venv").symlink_to(Path(sys.prefix))
    return workdir


@pytest.fixture
def newcomer_postgres() -> Iterator[ThrowawayPostgres]:
    # Its own server: the README creates the role `litellm` and the default databases.
    with ThrowawayPostgres() as server:
        yield server


def test_readme_sections_terminals_are_parsed() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    terminals = readme_terminals(readme)
    assert tuple(terminals) == TERMINALS
    # The install block is the README's first command without the demo, with the `stack` extra
    # (LiteLLM's migrations): this test's venv, whose `test` extra includes it.
    first_command = readme.split("```sh\n", 1)[1].splitlines()[0]
    install = terminals["install"].strip()
    assert install.endswith(" '.[stack]'")
    assert first_command.startswith(install.removesuffix(" '.[stack]'") + " . && ")


@pytest.mark.postgres
def test_readme_real_run_streams_through_gunicorn_and_postgres(
    clone_dir: Path, newcomer_postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl not installed (the README's client)")
    terminals = readme_terminals((REPO_ROOT / "README.md").read_text())
    pg = newcomer_postgres
    port = free_port()
    dropped = variable_names() | {"PROMETHEUS_MULTIPROC_DIR"}
    env = {name: value for name, value in os.environ.items() if name not in dropped and not name.startswith("PG")}
    env.update(
        PSQL=f"{pg.bin_dir / 'psql'} postgresql://{pg.user}:{pg.password}@{pg.host}:{pg.port}/postgres",
        DB_HOST=pg.host,
        DB_PORT=str(pg.port),
        PORT=str(port),
    )

    superuser = subprocess.run(bash(terminals["superuser"]), cwd=clone_dir, env=env, capture_output=True, text=True, timeout=60)
    assert superuser.returncode == 0, superuser.stderr

    running: list[Terminal] = []

    def start(name: str) -> Terminal:
        log_path = tmp_path / f"{name}.log"
        log_file = log_path.open("wb")
        process = subprocess.Popen(
            bash(terminals[name]), cwd=clone_dir, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        terminal = Terminal(name, process, log_path, log_file)
        running.append(terminal)
        return terminal

    env_file = clone_dir / "stack.env"
    try:
        stack = start("terminal-1")
        deadline = time.monotonic() + 90
        while not env_file.exists():
            stack.assert_running()
            assert time.monotonic() < deadline, f"no stack.env:\n{stack.output()}"
            time.sleep(0.1)

        service = start("terminal-2")
        deadline = time.monotonic() + 60
        while True:
            service.assert_running()
            try:
                if requests.get(f"http://127.0.0.1:{port}/health/liveness", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"gunicorn not live:\n{service.output()}"
            time.sleep(0.1)

        client = subprocess.run(bash(terminals["terminal-3"]), cwd=clone_dir, env=env, capture_output=True, text=True, timeout=60)
        assert client.returncode == 0, f"{client.stderr}\n{service.output()}"
    finally:
        exits = {terminal.name: terminal.interrupt() for terminal in reversed(running)}

    stream, _, users_json = client.stdout.partition("data: [DONE]\n\n")
    assert users_json, f"the stream did not end with [DONE]:\n{client.stdout}"
    content = "".join(
        (json.loads(event[len("data: ") :])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for event in stream.split("\n\n")
        if event.startswith("data: {")
    )
    assert content == completion_text(STACK_CHUNKS)
    users = json.loads(users_json)
    assert "users" in users, users
    assert [user["user_id"] for user in users["users"]] == ["newcomer:ai"]
    assert users["users"][0]["budget_id"] == "end-user-budget-ai"

    # Ctrl-C ends both cleanly; the stack takes its keys with it; nothing failed on the way.
    assert exits == {"terminal-2": 0, "terminal-1": 0}, exits
    assert not env_file.exists()
    for terminal in running:
        assert "Traceback" not in terminal.output(), terminal.output()
        assert not PROBLEM_LINE.search(terminal.output()), terminal.output()
