"""Command line: `python -m mlpa_aiohttp serve | demo | fake-upstream | migrate`."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Sequence

import uvloop
from aiohttp import web

from .app import app_factory, create_app
from .observability.logging import configure_logging
from .settings import Settings, SettingsError

DEMO_PROMPT = '{"model": "gpt-oss-120b", "stream": true, "messages": [{"role": "user", "content": "Hello!"}]}'


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlpa_aiohttp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the service with configuration from the environment")
    demo = commands.add_parser("demo", help="run the service against built-in fake LiteLLM and FxA")
    demo.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    fake = commands.add_parser("fake-upstream", help="run the fake LiteLLM alone")
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=int, default=4000)
    fake.add_argument("--ttft", type=float, default=0.2, help="seconds before the first streamed byte")
    fake.add_argument("--chunks", type=int, default=30, help="content chunks per stream")
    fake.add_argument("--interval", type=float, default=0.05, help="seconds between chunks")
    commands.add_parser("migrate", help="create/upgrade the app database and seed the capacity row")
    args = parser.parse_args(argv)

    try:
        if args.command == "serve":
            return _serve()
        if args.command == "demo":
            return uvloop.run(_demo(args.port))
        if args.command == "fake-upstream":
            return uvloop.run(_fake_upstream(args.host, args.port, args.ttft, args.chunks, args.interval))
        if args.command == "migrate":
            return _migrate()
    except SettingsError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 1


def _serve() -> int:
    settings = Settings.from_environ(os.environ)  # fail early, before the loop starts
    web.run_app(
        app_factory(),
        loop=uvloop.new_event_loop(),
        host="0.0.0.0",
        port=settings.server.port,
        access_log=None,
        # run_app's default is 128: a burst of new streams overflows it (docs/performance.md).
        backlog=settings.server.listen_backlog,
        # Streams are drained by our on_shutdown hook first; this bounds the rest.
        shutdown_timeout=settings.server.shutdown_drain_seconds + 5,
        print=None,
    )
    return 0


def _migrate() -> int:
    from .store.migrate import migrate_command

    settings = Settings.from_environ(os.environ, check_secrets=False)
    configure_logging(level=settings.server.log_level, json=settings.server.log_json)
    return migrate_command(settings)


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]
    return runner, bound_port


async def _demo(port: int) -> int:
    from .testing.fake_fxa import FakeFxA
    from .testing.fake_litellm import FakeLiteLLM

    configure_logging(level=os.environ.get("LOG_LEVEL", "INFO").upper(), json=False)
    fake_litellm = FakeLiteLLM(interval=0.05, chunks=20)
    fake_fxa = FakeFxA()
    litellm_runner, litellm_port = await _start(fake_litellm.make_app(), "127.0.0.1", 0)
    fxa_runner, fxa_port = await _start(fake_fxa.make_app(), "127.0.0.1", 0)
    environ = {
        **os.environ,
        "LITELLM_API_BASE": f"http://127.0.0.1:{litellm_port}",
        "FXA_BASE_URL": f"http://127.0.0.1:{fxa_port}/v1",
        "MLPA_VIRTUAL_KEY": fake_litellm.virtual_key,
        "MASTER_KEY": fake_litellm.master_key,
        "MLPA_STORE": "memory",
    }
    settings = Settings.from_environ(environ, demo=True)
    service_runner, service_port = await _start(create_app(settings), "127.0.0.1", port)
    base = f"http://127.0.0.1:{service_port}"
    print(f"mlpa-aiohttp demo ready on {base} (fake LiteLLM :{litellm_port}, fake FxA :{fxa_port})", flush=True)
    print(
        f"  curl -N {base}/v1/chat/completions -H 'authorization: Bearer {fake_fxa.demo_token}' "
        f"-H 'service-type: ai' -H 'content-type: application/json' -d '{DEMO_PROMPT}'",
        flush=True,
    )
    try:
        await _wait_for_signal()
    finally:
        for runner in (service_runner, fxa_runner, litellm_runner):
            await runner.cleanup()
    return 0


async def _fake_upstream(host: str, port: int, ttft: float, chunks: int, interval: float) -> int:
    from .testing.fake_litellm import run_fake_upstream

    configure_logging(level="WARNING", json=False)
    server = asyncio.ensure_future(run_fake_upstream(host, port, ttft=ttft, chunks=chunks, interval=interval))
    print(f"fake LiteLLM listening on http://{host}:{port}", flush=True)
    waiter = asyncio.ensure_future(_wait_for_signal())
    await asyncio.wait({server, waiter}, return_when=asyncio.FIRST_COMPLETED)
    for task in (server, waiter):
        task.cancel()
    await asyncio.gather(server, waiter, return_exceptions=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
