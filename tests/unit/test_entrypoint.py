"""The image's entrypoint (config/docker-entrypoint.sh), run for real with `sh`: the jemalloc
preload, MEMRAY_ENABLED / MEMRAY_OUTPUT, and `exec` (the command keeps the entrypoint's pid, so
signals sent to the container's PID 1 reach it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "config" / "docker-entrypoint.sh"
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def fake_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def run(tmp_path: Path, *command: str, env: dict[str, str] | None = None, tools: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = f"{tools}:{SYSTEM_PATH}" if tools is not None else SYSTEM_PATH
    environ = {"PATH": path, "MEMRAY_OUTPUT": str(tmp_path / "memray" / "mlpa.bin"), **(env or {})}
    return subprocess.run(["sh", str(ENTRYPOINT), *command], env=environ, capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    return directory


def test_the_script_is_executable_posix_sh() -> None:
    assert os.access(ENTRYPOINT, os.X_OK)
    assert ENTRYPOINT.read_text().startswith("#!/bin/sh\n")
    assert subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=False).returncode == 0


def test_jemalloc_found_by_ldconfig_replaces_any_inherited_preload(tmp_path: Path, tools: Path) -> None:
    fake_tool(tools, "ldconfig", 'echo "\tlibjemalloc.so.2 (libc6,x86-64) => /opt/lib/libjemalloc.so.2"\n')
    done = run(tmp_path, "sh", "-c", 'echo "$LD_PRELOAD"', env={"LD_PRELOAD": "/inherited.so"}, tools=tools)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/opt/lib/libjemalloc.so.2"


def test_without_jemalloc_the_preload_is_left_alone(tmp_path: Path, tools: Path) -> None:
    fake_tool(tools, "ldconfig", 'echo "\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6"\n')
    done = run(tmp_path, "sh", "-c", 'echo "${LD_PRELOAD-unset}"', tools=tools)
    assert done.stdout.strip() == "unset"
    done = run(tmp_path, "sh", "-c", 'echo "$LD_PRELOAD"', env={"LD_PRELOAD": "/inherited.so"}, tools=tools)
    assert done.stdout.strip() == "/inherited.so"


@pytest.mark.skipif(not shutil.which("ldconfig") and not Path("/sbin/ldconfig").exists(), reason="no ldconfig")
def test_the_real_jemalloc_is_mapped_into_the_command(tmp_path: Path) -> None:
    listing = subprocess.run(["sh", "-c", "ldconfig -p"], env={"PATH": SYSTEM_PATH}, capture_output=True, text=True, check=False).stdout
    if "libjemalloc.so.2 " not in listing:
        pytest.skip("libjemalloc2 is not installed here")
    done = run(tmp_path, sys.executable, "-c", "print(open('/proc/self/maps').read())")
    assert done.returncode == 0, done.stderr
    assert "libjemalloc.so.2" in done.stdout


def test_the_command_replaces_the_shell_and_gets_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "terminated"
    program = (
        "import os, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(marker)!r}, 'w').write(str(os.getpid())), sys.exit(0)))\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(30)\n"
    )
    environ = {"PATH": SYSTEM_PATH, "MEMRAY_OUTPUT": str(tmp_path / "m" / "out.bin")}
    process = subprocess.Popen(["sh", str(ENTRYPOINT), sys.executable, "-c", program], env=environ, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        pid = int(process.stdout.readline())
        assert pid == process.pid, "the entrypoint must exec the command, not run it as a child"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert marker.read_text() == str(pid)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_memray_output_directory_is_made_on_every_start(tmp_path: Path) -> None:
    done = run(tmp_path, "true")
    assert done.returncode == 0
    assert (tmp_path / "memray").is_dir()


def test_an_unmakeable_output_directory_fails_the_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = run(tmp_path, "echo", "started", env={"MEMRAY_OUTPUT": str(blocker / "sub" / "out.bin")})
    assert done.returncode != 0
    assert "started" not in done.stdout


@pytest.mark.parametrize(
    "command, expected_tail",
    [
        (["gunicorn", "-c", "conf.py", "app:factory"], ["{tools}/gunicorn", "-c", "conf.py", "app:factory"]),
        (["python", "-m", "mlpa_aiohttp", "serve"], ["-m", "mlpa_aiohttp", "serve"]),
    ],
)
def test_memray_enabled_runs_the_command_under_memray(tmp_path: Path, tools: Path, command: list[str], expected_tail: list[str]) -> None:
    fake_tool(tools, "memray", 'for arg in "$@"; do echo "$arg"; done\necho "preload=$LD_PRELOAD"\n')
    fake_tool(tools, "gunicorn", "exit 3\n")
    fake_tool(tools, "ldconfig", 'echo "\tlibjemalloc.so.2 (libc6,x86-64) => /opt/lib/libjemalloc.so.2"\n')
    output = tmp_path / "memray" / "mlpa.bin"
    done = run(tmp_path, *command, env={"MEMRAY_ENABLED": "true"}, tools=tools)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    tail = [part.format(tools=tools) for part in expected_tail]
    assert lines == ["run", "-q", "-f", "--native", "--follow-fork", "-o", str(output), *tail, "preload=/opt/lib/libjemalloc.so.2"]


@pytest.mark.parametrize("value", ["false", "TRUE", "1", ""])
def test_memray_only_for_exactly_true(tmp_path: Path, tools: Path, value: str) -> None:
    fake_tool(tools, "memray", "echo memray-ran\n")
    done = run(tmp_path, "echo", "plain", env={"MEMRAY_ENABLED": value}, tools=tools)
    assert done.stdout.strip() == "plain"


def test_memray_enabled_without_memray_warns_and_starts(tmp_path: Path) -> None:
    started = time.monotonic()
    done = run(tmp_path, "echo", "plain", env={"MEMRAY_ENABLED": "true"})
    assert done.returncode == 0 and done.stdout.strip() == "plain"
    assert "memray is not installed" in done.stderr
    assert time.monotonic() - started < 10
