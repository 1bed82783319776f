"""The Docker image, built and run for real without a daemon (opt-in: `-m image`).

    apt-get install buildah mmdebstrap
    python -m pytest -m image -s tests/e2e/test_image.py      # ~5 min the first time, ~2 min after

1. A Python base image bootstrapped from Debian's own packages (mmdebstrap: bookworm,
   python3, python3-venv, python-is-python3, ca-certificates), imported with buildah. It is
   cached in the test storage and reused.
2. The repository's Dockerfile built with buildah (vfs storage, chroot isolation, so it runs
   as root inside an unprivileged container too), that base passed as `PYTHON_IMAGE`. The
   host's CA bundle is mounted for the build's `pip install` (a TLS-intercepting proxy), the
   image keeps Debian's.
3. The image's command run with `buildah run` against loopback fakes of LiteLLM and FxA
   served by this test: liveness, one streamed completion, then SIGTERM to gunicorn, which
   must exit 0 - all as the image's non-root user (uid 10001). Chroot isolation shares the
   host's network, so gunicorn's bind is narrowed to 127.0.0.1.

Storage: `MLPA_IMAGE_STORAGE` (default /var/tmp/mlpa-image-test); delete it to start over.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import aiohttp
import pytest

from ..conftest import TEST_SECRETS, chat_body
from tests.support.processes import free_port

pytestmark = pytest.mark.image

REPO_ROOT = Path(__file__).resolve().parents[2]
STORAGE = Path(os.environ.get("MLPA_IMAGE_STORAGE", "/var/tmp/mlpa-image-test"))
BASE_IMAGE = "localhost/python-debian:3.11-bookworm"
APP_IMAGE = "localhost/mlpa-aiohttp:image-test"
BASE_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
NON_ROOT_UID = 10001


def buildah(*args: str, timeout: float = 600, log: IO[str] | None = None) -> str:
    command = [
        "buildah",
        "--root", str(STORAGE / "storage"),
        "--runroot", str(STORAGE / "run"),
        "--storage-driver", "vfs",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if log is not None:
        log.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}\n")
    assert done.returncode == 0, f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def image_exists(name: str) -> bool:
    try:
        buildah("inspect", "--type", "image", name, timeout=60)
    except AssertionError:
        return False
    return True


@pytest.fixture(scope="module")
def build_log() -> IO[str]:
    STORAGE.mkdir(parents=True, exist_ok=True)
    with (STORAGE / "build.log").open("w") as log:
        yield log


@pytest.fixture(scope="module")
def app_image(build_log: IO[str]) -> str:
    for tool in ("buildah", "mmdebstrap"):
        assert shutil.which(tool), f"{tool} missing: apt-get install buildah mmdebstrap"
    if not image_exists(BASE_IMAGE):
        rootfs = STORAGE / "python-bookworm.tar"
        sources = [str(p) for p in Path("/etc/apt/sources.list.d").glob("*.sources")] or ["http://deb.debian.org/debian"]
        started = time.monotonic()
        done = subprocess.run(
            ["mmdebstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs), *sources],
            capture_output=True, text=True, timeout=1200,
        )
        build_log.write(f"$ mmdebstrap ...\n{done.stderr[-2000:]}\n")
        assert done.returncode == 0, done.stderr[-3000:]
        print(f"\nmmdebstrap: base root filesystem in {time.monotonic() - started:.0f} s")
        container = buildah("from", "scratch", log=build_log).strip()
        try:
            buildah("add", container, str(rootfs), "/", log=build_log)
            buildah(
                "config",
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                # pip in the builder stage trusts the system bundle (mounted from the host below).
                "--env", f"PIP_CERT={HOST_CA_BUNDLE}",
                "--cmd", '["python3"]',
                container,
                log=build_log,
            )
            buildah("commit", "-q", container, BASE_IMAGE, log=build_log)
        finally:
            buildah("rm", container, log=build_log)
        rootfs.unlink()
    started = time.monotonic()
    volume = [f"--volume={HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.exists() else []
    output = buildah(
        "build", "--isolation", "chroot", *volume,
        "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}",
        "-t", APP_IMAGE, "-f", str(REPO_ROOT / "Dockerfile"), str(REPO_ROOT),
        timeout=1200, log=build_log,
    )
    buildah("rmi", "--prune", log=build_log)  # the builder stage and earlier builds' leftovers
    print(f"\nbuildah build: {APP_IMAGE} in {time.monotonic() - started:.0f} s")
    print("\n".join(line for line in output.splitlines() if "STEP" in line or "Successfully" in line))
    return APP_IMAGE


def gunicorn_master(runner_pid: int) -> int:
    """The gunicorn master under `buildah run`: a process running gunicorn whose parent does not."""
    def command(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""

    def parent(pid: int) -> int:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat[stat.rfind(b")") + 2 :].split()[1])

    def descends_from_runner(pid: int) -> bool:
        while pid > 1:
            if pid == runner_pid:
                return True
            try:
                pid = parent(pid)
            except OSError:
                return False
        return False

    def runs_gunicorn(pid: int) -> bool:
        # buildah's own chroot helper carries the command in its arguments too.
        argv = command(pid).split()
        return bool(argv) and "buildah" not in argv[0] and "gunicorn" in command(pid)

    masters = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and runs_gunicorn(int(entry.name))
        and not runs_gunicorn(parent(int(entry.name)))
        and descends_from_runner(int(entry.name))
    ]
    assert len(masters) == 1, masters
    return masters[0]


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


async def test_image_serves_a_stream_and_stops_cleanly_as_non_root(
    app_image: str, fake_litellm_server, fake_fxa_server, tmp_path: Path
) -> None:
    (fake, litellm_server), (fxa, fxa_server) = fake_litellm_server, fake_fxa_server
    port = free_port()
    environment = {
        **TEST_SECRETS,
        # The Google credentials file named there is not in the image; no Android client here.
        "PLAY_INTEGRITY_ENABLED": "false",
        "MLPA_STORE": "memory",
        "LITELLM_API_BASE": str(litellm_server.make_url("")).rstrip("/"),
        "FXA_BASE_URL": str(fxa_server.make_url("/v1")),
        "PORT": str(port),
        "SHUTDOWN_DRAIN_SECONDS": "1",
        "LOG_JSON": "true",
    }
    container = buildah("from", "-q", app_image).strip()
    log_path = tmp_path / "container.log"
    log_file = log_path.open("wb")
    # The image's ENTRYPOINT and CMD (`buildah run` runs only what it is given), with the bind
    # narrowed to loopback (chroot isolation shares the host's network). The entrypoint `exec`s
    # gunicorn, so the SIGTERM below reaches gunicorn's master itself.
    command = ["/app/docker-entrypoint.sh", "gunicorn", "-c", "/app/config/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}", "mlpa_aiohttp.app:app_factory"]
    env_flags = [flag for name, value in environment.items() for flag in ("--env", f"{name}={value}")]
    runner = subprocess.Popen(
        ["buildah", "--root", str(STORAGE / "storage"), "--runroot", str(STORAGE / "run"), "--storage-driver", "vfs",
         "run", "--isolation", "chroot", "--network", "host", *env_flags, container, "--", *command],
        stdout=log_file, stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as session:
            while True:
                assert runner.poll() is None, log_path.read_text(errors="replace")
                try:
                    async with session.get(f"{base}/health/liveness") as response:
                        if response.status == 200 and b"Worker ready" in log_path.read_bytes():
                            liveness = await response.json()
                            break
                except aiohttp.ClientConnectionError:
                    pass
                assert time.monotonic() < deadline, log_path.read_text(errors="replace")
                await asyncio.sleep(0.2)
            assert liveness == {"status": "alive"}

            headers = {"authorization": f"Bearer {fxa.issue_jwt('image-user')}", "service-type": "ai", "content-type": "application/json"}
            async with session.post(f"{base}/v1/chat/completions", data=json.dumps(chat_body(stream=True)), headers=headers) as response:
                assert response.status == 200
                stream = await response.read()
        assert stream.endswith(b"data: [DONE]\n\n")
        content = "".join(
            (json.loads(event[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
            for event in stream.decode().split("\n\n")
            if event.startswith("data: {")
        )
        assert content == fake.completion_text()
        print(f"\nliveness: {liveness}; streamed {len(stream)} bytes, content {content!r}")

        master = gunicorn_master(runner.pid)
        assert uid_of(master) == NON_ROOT_UID
        signalled = time.monotonic()
        os.kill(master, signal.SIGTERM)
        exit_code = await asyncio.to_thread(runner.wait, 30)
        output = log_path.read_text(errors="replace")
        print(f"SIGTERM to gunicorn (pid {master}, uid {uid_of_safe(master)}): buildah run exited {exit_code} after {time.monotonic() - signalled:.1f} s")
        assert exit_code == 0, output
        assert "Worker exiting" in output and "Shutting down: Master" in output, output
        assert "Traceback" not in output, output
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        log_file.close()
        buildah("rm", container)


def uid_of_safe(pid: int) -> str:
    try:
        return str(uid_of(pid))
    except (OSError, AssertionError):
        return f"{NON_ROOT_UID} (checked before the signal)"
