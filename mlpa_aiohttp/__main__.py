"""mlpa-aiohttp, the authenticating LLM proxy: run it, try it, migrate its database.

Each subcommand is one `_add_<name>` function that registers its parser and the function
that runs it; `main` only parses and turns start-up failures into one message and an exit
status (README "Start-up errors"). The service's modules are imported by the runners, so
`--help` and `--version` answer at once.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import secrets
import signal
import sys
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from . import __version__, client_sockets
from .observability.logging import configure_logging
from .settings import Settings, SettingsError, variable_names
from .settings_compat import warn_about_environment
from .startup import (
    EXIT_CANNOT_LISTEN,
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    report_config_error,
    report_unavailable,
)
from .store.base import StoreUnavailable

if TYPE_CHECKING:
    from aiohttp import web

PROG = "python -m mlpa_aiohttp"
DEMO_PROMPT = '{"model": "gpt-oss-120b", "stream": true, "messages": [{"role": "user", "content": "Hello!"}]}'
DATABASE_HINT = (
    "start PostgreSQL or correct DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD, LITELLM_DB_NAME, APP_ATTEST_DB_NAME"
)

EXIT_DONE = 0
EXIT_USAGE = 2  # argparse
EXIT_STACK_REFUSED = 1  # `stack` only: the database is LiteLLM's real one, or cannot be prepared
EXIT_MEANINGS = {
    EXIT_DONE: "done, or stopped cleanly (SIGTERM, SIGINT)",
    EXIT_STACK_REFUSED: "stack: the database is a real LiteLLM one, or cannot be prepared",
    EXIT_USAGE: "command-line usage error",
    EXIT_UNAVAILABLE: "PostgreSQL unreachable at start-up",
    EXIT_CANNOT_LISTEN: "the port is in use or cannot be bound",
    EXIT_CONFIG: "configuration error: every invalid variable is listed in one message",
}


def exit_statuses_text(statuses: Sequence[int]) -> str:
    """The "exit statuses:" block of a --help: always 0 and 2, then the command's own."""
    listed = sorted({EXIT_DONE, EXIT_USAGE, *statuses})
    return "exit statuses:\n" + "\n".join(f"  {code:<3} {EXIT_MEANINGS[code]}" for code in listed)

SERVE_VARIABLES = """environment:
  Every variable in README "Configuration" (config/example.env has the list ready to
  copy). Set at least: LITELLM_API_BASE, MLPA_VIRTUAL_KEY, MASTER_KEY, MLPA_UI_ACCESS_KEY,
  MLPA_ACCESS_TOKEN_SECRET (32 bytes or more), MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN,
  DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD; PORT is the default of --port, LOG_JSON=true
  for JSON lines. Production runs it under gunicorn: see config/gunicorn.conf.py."""

DEMO_VARIABLES = """environment:
  PORT (default of --port), LOG_LEVEL. The demo sets LITELLM_API_BASE, FXA_BASE_URL, the
  LiteLLM keys, MLPA_UI_ACCESS_KEY and MLPA_STORE=memory itself; any other variable of
  README "Configuration" applies as set (MLPA_DEBUG is not needed: the demo accepts
  development secrets)."""

FAKE_UPSTREAM_VARIABLES = """environment:
  none; the options above are all it reads. Its keys: virtual sk-test-virtual,
  master sk-test-master."""

MIGRATE_VARIABLES = """environment:
  DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD, APP_ATTEST_DB_NAME (the database it creates
  if missing, so the user needs CREATEDB, and upgrades), MLPA_MAX_SIGNED_IN_USERS (the
  signup-capacity row it seeds), PG_MAINTENANCE_STATEMENT_TIMEOUT_MS,
  PG_PREPARED_STMT_CACHE_MAX_SIZE, LOG_JSON, LOG_LEVEL. No service secret is needed."""

Runner = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Runner = args.run
    try:
        return run(args)
    except SettingsError as error:
        return report_config_error(error, os.environ)
    except KeyboardInterrupt:
        return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog=f"{PROG} COMMAND --help names the variables COMMAND reads and its exit statuses.\n\n"
        + exit_statuses_text(tuple(EXIT_MEANINGS)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mlpa-aiohttp {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_serve, _add_demo, _add_fake_upstream, _add_migrate, _add_stack):
        add(commands)
    return parser


def _subcommand(
    commands: argparse._SubParsersAction,
    name: str,
    summary: str,
    variables: str,
    run: Runner,
    *,
    exits: Sequence[int],
) -> argparse.ArgumentParser:
    """`exits`: the statuses `run` can return besides 0 and 2 (tests/unit/test_readme_facts.py
    checks them against the code)."""
    parser = commands.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=f"{variables}\n\n{exit_statuses_text(exits)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=run)
    return parser


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {port}")
    return port


# -- serve -----------------------------------------------------------------------------------


def _add_serve(commands: argparse._SubParsersAction) -> None:
    serve = _subcommand(
        commands, "serve", "run the service with its configuration from the environment",
        SERVE_VARIABLES,
        _run_serve,
        exits=(EXIT_UNAVAILABLE, EXIT_CANNOT_LISTEN, EXIT_CONFIG),
    )
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0, every interface)")
    serve.add_argument("--port", type=_port, default=None, help="port to listen on (default: PORT, else 8080)")


def _run_serve(args: argparse.Namespace) -> int:
    import uvloop
    from aiohttp import web

    from .app import app_factory

    settings = Settings.from_environ(os.environ)  # fail early, before the loop starts
    port = settings.server.port if args.port is None else args.port
    try:
        # Our own listening socket: accepted clients inherit its dead-peer options.
        listener = client_sockets.listening_socket(
            args.host, port, settings.server.dead_peer_options(), backlog=settings.server.listen_backlog
        )
        web.run_app(
            app_factory(),
            loop=uvloop.new_event_loop(),
            sock=listener,
            # The loop listens again with this one; run_app's default of 128 overflows under
            # a burst of new streams (docs/performance.md, "Admission").
            backlog=settings.server.listen_backlog,
            access_log=None,
            # Streams are drained by our on_shutdown hook first; this bounds the rest.
            shutdown_timeout=settings.server.shutdown_drain_seconds + 5,
            print=None,
        )
    except StoreUnavailable as error:
        return report_unavailable("database", error, os.environ, hint=DATABASE_HINT, exit_code=EXIT_UNAVAILABLE)
    except OSError as error:
        return _cannot_listen(error, args.host, port, os.environ)
    return 0


def _cannot_listen(error: OSError, host: str, port: int, environ: Mapping[str, str]) -> int:
    if error.errno == errno.EADDRINUSE:
        problem = f"port {port} on {host} is already in use"
        hint = f"stop the process holding it (ss -ltnp 'sport = :{port}' shows it) or choose another with --port"
    elif error.errno == errno.EACCES:
        problem = f"no permission to listen on {host}:{port}"
        hint = "choose a port above 1023 with --port"
    elif error.errno == errno.EADDRNOTAVAIL:
        problem = f"{host} is not an address of this machine"
        hint = "choose another with --host (127.0.0.1 or 0.0.0.0)"
    else:
        raise error
    return report_unavailable("port", problem, environ, hint=hint, exit_code=EXIT_CANNOT_LISTEN)


# -- demo ------------------------------------------------------------------------------------


def _add_demo(commands: argparse._SubParsersAction) -> None:
    demo = _subcommand(
        commands,
        "demo",
        "run the service on 127.0.0.1 against built-in fake LiteLLM and FxA servers (no database)",
        DEMO_VARIABLES,
        _run_demo,
        exits=(EXIT_CANNOT_LISTEN, EXIT_CONFIG),
    )
    demo.add_argument("--port", type=_port, default=None, help="port of the service (default: PORT, else 8080)")


def _run_demo(args: argparse.Namespace) -> int:
    checked = Settings.from_environ(os.environ, demo=True)  # every problem before anything starts
    port = checked.server.port if args.port is None else args.port
    import uvloop

    try:
        return uvloop.run(_demo(port, checked.server.log_level))
    except OSError as error:
        return _cannot_listen(error, "127.0.0.1", port, os.environ)


def _add_stack(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from .testing.stack import configure_parser, stack_command

    stack = commands.add_parser(
        "stack", help="DEVELOPMENT: fake LiteLLM (end users in PostgreSQL) and fake FxA; prints keys, env, a token"
    )
    configure_parser(stack)
    stack.epilog = f"{stack.epilog}\n\n{exit_statuses_text((EXIT_STACK_REFUSED, EXIT_CONFIG))}"
    stack.set_defaults(run=stack_command)


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    return runner, bound_port


async def _demo(port: int, log_level: str) -> int:
    from .app import create_app
    from .testing.fake_fxa import FakeFxA
    from .testing.fake_litellm import FakeLiteLLM

    configure_logging(level=log_level, json=False)
    fake_litellm = FakeLiteLLM(interval=0.05, chunks=20)
    fake_fxa = FakeFxA()
    ui_key = os.environ.get("MLPA_UI_ACCESS_KEY", "").strip() or f"demo-ui-{secrets.token_urlsafe(12)}"
    runners: list[web.AppRunner] = []
    try:
        litellm_runner, litellm_port = await _start(fake_litellm.make_app(), "127.0.0.1", 0)
        runners.append(litellm_runner)
        fxa_runner, fxa_port = await _start(fake_fxa.make_app(), "127.0.0.1", 0)
        runners.append(fxa_runner)
        environ = {
            **os.environ,
            "LITELLM_API_BASE": f"http://127.0.0.1:{litellm_port}",
            "FXA_BASE_URL": f"http://127.0.0.1:{fxa_port}/v1",
            "MLPA_VIRTUAL_KEY": fake_litellm.virtual_key,
            "MASTER_KEY": fake_litellm.master_key,
            "MLPA_UI_ACCESS_KEY": ui_key,
            "MLPA_STORE": "memory",
        }
        settings = Settings.from_environ(environ, demo=True)
        service_runner, service_port = await _start(create_app(settings), "127.0.0.1", port)
        runners.insert(0, service_runner)
        base = f"http://127.0.0.1:{service_port}"
        print(demo_banner(base, litellm_port, fxa_port, fake_fxa.demo_token, ui_key, fake_litellm), flush=True)
        await _wait_for_signal()
    finally:
        for runner in runners:
            await runner.cleanup()
    return 0


def demo_banner(base: str, litellm_port: int, fxa_port: int, token: str, ui_key: str, fake_litellm) -> str:
    """What the demo prints once it listens: the first line names the service's URL, the
    second is the curl that streams a completion (tests read both)."""
    return "\n".join(
        [
            f"mlpa-aiohttp demo ready on {base} (fake LiteLLM :{litellm_port}, fake FxA :{fxa_port}, users in memory)",
            f"  curl -N {base}/v1/chat/completions -H 'authorization: Bearer {token}' "
            f"-H 'service-type: ai' -H 'content-type: application/json' -d '{DEMO_PROMPT}'",
            f"  API docs      {base}/api/docs",
            f"  admin page    {base}/admin   (asks for the UI access key below)",
            f"  metrics       {base}/metrics",
            f"  readiness     {base}/health/readiness",
            "  keys of this run:",
            f"    FxA bearer token         {token}",
            f"    MLPA_UI_ACCESS_KEY       {ui_key}",
            f"    MASTER_KEY (fake LiteLLM, also the /user admin API key)  {fake_litellm.master_key}",
            f"    MLPA_VIRTUAL_KEY (fake LiteLLM)  {fake_litellm.virtual_key}",
            "  Ctrl-C stops it.",
        ]
    )


# -- fake-upstream ---------------------------------------------------------------------------


def _add_fake_upstream(commands: argparse._SubParsersAction) -> None:
    fake = _subcommand(
        commands,
        "fake-upstream",
        "run the fake LiteLLM alone (for load tests)",
        FAKE_UPSTREAM_VARIABLES,
        _run_fake,
        exits=(EXIT_CANNOT_LISTEN,),
    )
    fake.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    fake.add_argument("--port", type=_port, default=4000, help="port to listen on (default: 4000)")
    fake.add_argument("--ttft", type=float, default=0.2, help="seconds before the first streamed byte")
    fake.add_argument("--chunks", type=int, default=30, help="content chunks per stream")
    fake.add_argument("--interval", type=float, default=0.05, help="seconds between chunks")


def _run_fake(args: argparse.Namespace) -> int:
    import uvloop

    try:
        return uvloop.run(_fake_upstream(args.host, args.port, args.ttft, args.chunks, args.interval))
    except OSError as error:
        return _cannot_listen(error, args.host, args.port, os.environ)


async def _fake_upstream(host: str, port: int, ttft: float, chunks: int, interval: float) -> int:
    from .testing.fake_litellm import run_fake_upstream

    configure_logging(level="WARNING", json=False)
    server = asyncio.ensure_future(
        run_fake_upstream(
            host,
            port,
            ttft=ttft,
            chunks=chunks,
            interval=interval,
            on_started=lambda url: print(f"fake LiteLLM listening on {url}", flush=True),
        )
    )
    waiter = asyncio.ensure_future(_wait_for_signal())
    await asyncio.wait({server, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if server.done() and not server.cancelled() and server.exception() is not None:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        raise server.exception()  # the port could not be bound: one message, not a "listening" lie
    for task in (server, waiter):
        task.cancel()
    await asyncio.gather(server, waiter, return_exceptions=True)
    return 0


# -- migrate ---------------------------------------------------------------------------------


def _add_migrate(commands: argparse._SubParsersAction) -> None:
    migrate = _subcommand(
        commands,
        "migrate",
        "create or upgrade the app database and seed the signup-capacity row",
        MIGRATE_VARIABLES,
        _run_migrate,
        exits=(EXIT_UNAVAILABLE, EXIT_CONFIG),
    )
    migrate.add_argument(
        "--skip-role-timeouts",
        action="store_true",
        help="leave the database role's statement/idle-in-transaction timeouts alone (role managed elsewhere)",
    )


def _run_migrate(args: argparse.Namespace) -> int:
    from .store.migrate import migrate_command

    settings = Settings.from_environ(os.environ, check_secrets=False)
    configure_logging(level=settings.server.log_level, json=settings.server.log_json)
    warn_about_environment(os.environ, variable_names())
    return migrate_command(settings, role_timeouts=not args.skip_role_timeouts)


if __name__ == "__main__":
    sys.exit(main())
