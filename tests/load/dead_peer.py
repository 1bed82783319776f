"""A client that vanishes without a FIN or an RST, for real: two network namespaces joined by
a veth pair, the service (with the fakes) in one, the client in the other, then the client's
end of the link goes down mid-stream.

    python -m tests.load.dead_peer [--defaults]   # as root; prints the figures as JSON

The pytest wrapper is tests/load/test_dead_peer.py. Run from the repository root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SERVICE_ADDRESS = "10.203.0.1"
CLIENT_ADDRESS = "10.203.0.2"

# Short dead-peer settings: a vanished client is noticed within max(1, 3) + 1 = 4 s.
DEAD_PEER_ENV = {
    "CLIENT_KEEPALIVE_IDLE_SECONDS": "1",
    "CLIENT_KEEPALIVE_INTERVAL_SECONDS": "1",
    "CLIENT_KEEPALIVE_COUNT": "2",
    "CLIENT_USER_TIMEOUT_SECONDS": "3",
}
BOUND_SECONDS = 4.0


@dataclass(frozen=True)
class Namespaces:
    service: str
    client: str
    client_link: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"m10probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create a network namespace: {exc}"
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        _ip("netns", "del", probe)
    return None


@contextlib.contextmanager
def namespaces() -> Iterator[Namespaces]:
    tag = str(os.getpid())
    ns = Namespaces(service=f"m10svc{tag}", client=f"m10cli{tag}", client_link=f"m10c{tag}"[:15])
    service_link = f"m10s{tag}"[:15]
    _ip("netns", "add", ns.service)
    try:
        _ip("netns", "add", ns.client)
        try:
            _ip("link", "add", service_link, "netns", ns.service, "type", "veth", "peer", "name", ns.client_link, "netns", ns.client)
            _ip("-n", ns.service, "addr", "add", f"{SERVICE_ADDRESS}/30", "dev", service_link)
            _ip("-n", ns.client, "addr", "add", f"{CLIENT_ADDRESS}/30", "dev", ns.client_link)
            for name, link in ((ns.service, service_link), (ns.client, ns.client_link)):
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "link", "set", link, "up")
            yield ns
        finally:
            _ip("netns", "del", ns.client)  # takes the veth pair with it
    finally:
        _ip("netns", "del", ns.service)


# ---- the scenario, run inside the service namespace --------------------------------------------


async def scenario(client_netns: str, client_link: str, log_dir: Path, *, short_settings: bool = True) -> dict:
    """With `short_settings=False` the service keeps its defaults (a 130 s bound): the
    control, showing that the options, not something else, end the streams."""
    from .harness import Verdict, start_fakes, start_service

    fakes = await start_fakes(ttft=0.05, chunks=2000, interval=0.05)  # 100 s streams
    service = await start_service(fakes, log_dir, **(DEAD_PEER_ENV if short_settings else {}))
    clients: list[subprocess.Popen[bytes]] = []
    figures: dict = {"bound_seconds": BOUND_SECONDS}
    try:
        # One client mid-stream (data in flight: TCP_USER_TIMEOUT), one waiting for its first
        # byte (nothing in flight: keepalive probes).
        for request_id, content in (("vanish-streaming", "Hello"), ("vanish-idle", "Hello [fake:hang_before_headers]")):
            clients.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", client_netns, sys.executable, "-m", "tests.load.dead_peer", "client",
                     SERVICE_ADDRESS, str(service.port), request_id, content],
                    stdout=subprocess.PIPE,
                    cwd=Path(__file__).resolve().parents[2],
                )
            )
        for client in clients:
            assert client.stdout is not None
            ready = await asyncio.wait_for(asyncio.to_thread(client.stdout.readline), 20)
            assert ready.strip() in (b"streaming", b"waiting"), ready
        await asyncio.sleep(0.5)  # the idle client's request is at the upstream by now
        # The client vanishes: its end of the link goes down, nothing more leaves or arrives.
        _ip("-n", client_netns, "link", "set", client_link, "down")
        vanished_at = time.monotonic()
        records = {rid: _record(fakes, rid) for rid in ("vanish-streaming", "vanish-idle")}
        deadline = vanished_at + BOUND_SECONDS + (10 if short_settings else 2)
        while time.monotonic() < deadline and not all(r is not None and r.disconnected.is_set() for r in records.values()):
            await asyncio.sleep(0.05)
            records = {rid: _record(fakes, rid) for rid in records}
        figures["upstream_closed_after_seconds"] = {
            rid: None if r is None or r.disconnected_at is None else round(r.disconnected_at - vanished_at, 2)
            for rid, r in records.items()
        }
        await asyncio.sleep(0.5)
    finally:
        for client in clients:
            client.kill()
            client.wait(5)
        await asyncio.to_thread(service.stop)
        await fakes.close()
    verdict = Verdict.of(service.log_events())
    figures["canonical"] = {
        rid: [{k: line.get(k) for k in ("event", "result", "disconnect_reason", "status")} for line in verdict.canonical.get(rid, [])]
        for rid in ("vanish-streaming", "vanish-idle")
    }
    figures["errors"] = [{k: e.get(k) for k in ("event", "error_type", "request_id")} for e in verdict.errors]
    return figures


def _record(fakes, request_id: str):
    for record in fakes.litellm.requests_to("/v1/chat/completions"):
        if str(record.json["messages"][-1]["content"]).endswith(f" {request_id}"):
            return record
    return None


# ---- the client, run inside the client namespace -----------------------------------------------


async def client(host: str, port: int, request_id: str, content: str) -> None:
    from .harness import chat_request

    reader, writer = await asyncio.open_connection(host, port)
    writer.write(chat_request(request_id, host=host, content=f"{content} {request_id}"))
    await writer.drain()
    if "hang_before_headers" in content:
        print("waiting", flush=True)
    else:
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n", 1)[0], head
        await reader.read(1)
        print("streaming", flush=True)
    while await reader.read(65536):  # reads (and so ACKs) until the link goes away
        pass
    await asyncio.sleep(3600)


def run_in_namespaces(*, short_settings: bool = True) -> dict:
    """Set up the namespaces, run the scenario in the service's, return its figures."""
    import tempfile

    with namespaces() as ns, tempfile.TemporaryDirectory() as log_dir:
        completed = subprocess.run(
            ["ip", "netns", "exec", ns.service, sys.executable, "-m", "tests.load.dead_peer", "scenario",
             ns.client, ns.client_link, log_dir, "short" if short_settings else "defaults"],
            capture_output=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[2],
        )
    if completed.returncode != 0:
        raise RuntimeError(f"scenario failed ({completed.returncode}): {completed.stderr.decode()[-4000:]}")
    return json.loads(completed.stdout.decode().strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv and argv[0] == "client":
        asyncio.run(client(argv[1], int(argv[2]), argv[3], argv[4]))
        return 0
    if argv and argv[0] == "scenario":
        figures = asyncio.run(scenario(argv[1], argv[2], Path(argv[3]), short_settings=argv[4] == "short"))
        print(json.dumps(figures))
        return 0
    reason = unavailable_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    print(json.dumps(run_in_namespaces(short_settings="--defaults" not in argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
