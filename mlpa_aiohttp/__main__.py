"""mlpa-aiohttp, the authenticating LLM proxy: run it, try it, migrate its database, check its catalogue, print its configuration reference.

Each subcommand is one `_add_<name>` function that registers its parser and the function
that runs it; `main` only parses and turns start-up failures into one message and an exit
status (docs/operations.md, "Start-up errors"). The service's modules are imported by the runners, so
`--help` and `--version` answer at once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from . import __version__
from .fleet.traffic_contracts import ContractsRedisUnreachable
from .observability.logging import configure_logging
from .process import client_sockets
from .process.startup import (
    DATABASE_HINT,
    EXIT_CANNOT_LISTEN,
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    REDIS_HINT,
    listen_problem,
    report_config_error,
    report_unavailable,
)
from .settings import Settings, SettingsError, variable_names
from .settings.compat import warn_about_environment
from .store.base import StoreUnavailable

if TYPE_CHECKING:
    from aiohttp import web

log = structlog.get_logger("mlpa_aiohttp.serve")

PROG = "python -m mlpa_aiohttp"
DEMO_PROMPT = '{"model": "gpt-oss-120b", "stream": true, "messages": [{"role": "user", "content": "Hello!"}]}'

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
  Every variable in docs/configuration.md (config/example.env has the list ready to
  copy). Set at least: LITELLM_API_BASE, MLPA_VIRTUAL_KEY, MASTER_KEY, MLPA_UI_ACCESS_KEY,
  MLPA_ACCESS_TOKEN_SECRET (32 bytes or more), MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN,
  DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD; PORT is the default of --port, LOG_JSON=true
  for JSON lines, MLPA_ADMIN_PORT a second port for /metrics and the admin routes.
  Production runs it under gunicorn: see config/gunicorn.conf.py."""

DEMO_VARIABLES = """environment:
  PORT (default of --port), LOG_LEVEL. The demo sets LITELLM_API_BASE, FXA_BASE_URL, the
  LiteLLM keys, MLPA_UI_ACCESS_KEY and MLPA_STORE=memory itself; any other variable of
  docs/configuration.md applies as set (MLPA_DEBUG is not needed: the demo accepts
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
    for add in (_add_serve, _add_demo, _add_fake_upstream, _add_migrate, _add_catalog, _add_config, _add_stack):
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
    admin_port = settings.server.admin_port
    if admin_port is not None and admin_port == port:
        return report_config_error([f"MLPA_ADMIN_PORT: must differ from --port ({port}), got {admin_port}"], os.environ)
    listeners = []
    try:
        # Our own listening sockets: accepted clients inherit their dead-peer options.
        for listen_port in (port,) if admin_port is None else (port, admin_port):
            listeners.append(
                client_sockets.listening_socket(
                    args.host, listen_port, settings.server.dead_peer_options(), backlog=settings.server.listen_backlog
                )
            )
        address = "{}:{}".format(*listeners[0].getsockname()[:2])
        # With MLPA_ADMIN_PORT, the same app on both; routes/admin_port.py keeps each to its routes.
        admin_fields = {"admin_address": "{}:{}".format(*listeners[1].getsockname()[:2])} if admin_port else {}
        web.run_app(
            app_factory(),
            loop=uvloop.new_event_loop(),
            sock=listeners,
            # The loop listens again with this one; run_app's default of 128 overflows under
            # a burst of new streams (docs/performance.md, "The burst and the listen backlog").
            backlog=settings.server.listen_backlog,
            access_log=None,
            # Streams are drained by our on_shutdown hook first; this bounds the rest.
            shutdown_timeout=settings.server.shutdown_drain_seconds + 5,
            # Called once the app has started and its site serves (logging is set up by then).
            print=lambda _aiohttp_banner: log.info("serve_listening", address=address, pid=os.getpid(), **admin_fields),
        )
    except StoreUnavailable as error:
        return report_unavailable("database", error, os.environ, hint=DATABASE_HINT, exit_code=EXIT_UNAVAILABLE)
    except ContractsRedisUnreachable as error:
        return report_unavailable("redis", error, os.environ, hint=REDIS_HINT, exit_code=EXIT_UNAVAILABLE)
    except OSError as error:
        for listener in listeners:
            listener.close()
        if len(listeners) == 1 and admin_port is not None:  # the admin port could not be bound
            return _cannot_listen(error, args.host, admin_port, os.environ, choose_port="MLPA_ADMIN_PORT")
        return _cannot_listen(error, args.host, port, os.environ)
    log.info("serve_stopped", address=address)
    return 0


def _cannot_listen(
    error: OSError, host: str, port: int, environ: Mapping[str, str], *, choose_port: str = "--port"
) -> int:
    found = listen_problem(error, host, port, choose_port=choose_port, choose_host="--host")
    if found is None:
        raise error
    problem, hint = found
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


def _add_stack(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    from . import keys
    from .app import create_app
    from .store.memory import MemoryUserStore
    from .testing.fake_fxa import FakeFxA
    from .testing.fake_litellm import FakeLiteLLM, MemoryCustomerTable
    from .testing.fake_privacy_filter import FakePrivacyFilter

    configure_logging(level=log_level, json=False)
    litellm_customers = MemoryCustomerTable()
    fake_litellm = FakeLiteLLM(interval=0.05, chunks=20, customer_table=litellm_customers)
    fake_fxa = FakeFxA()
    fake_privacy_filter = FakePrivacyFilter()
    ui_key = os.environ.get("MLPA_UI_ACCESS_KEY", "").strip() or f"demo-ui-{secrets.token_urlsafe(12)}"
    runners: list[web.AppRunner] = []
    try:
        litellm_runner, litellm_port = await _start(fake_litellm.make_app(), "127.0.0.1", 0)
        runners.append(litellm_runner)
        fxa_runner, fxa_port = await _start(fake_fxa.make_app(), "127.0.0.1", 0)
        runners.append(fxa_runner)
        filter_runner, filter_port = await _start(fake_privacy_filter.make_app(), "127.0.0.1", 0)
        runners.append(filter_runner)
        environ = {
            **os.environ,
            "LITELLM_API_BASE": f"http://127.0.0.1:{litellm_port}",
            "FXA_BASE_URL": f"http://127.0.0.1:{fxa_port}/v1",
            "MLPA_VIRTUAL_KEY": fake_litellm.virtual_key,
            "MASTER_KEY": fake_litellm.master_key,
            "MLPA_UI_ACCESS_KEY": ui_key,
            "MLPA_STORE": "memory",
            "PRIVACY_FILTER_ENABLED": "true",
            "PRIVACY_FILTER_API_BASE": f"http://127.0.0.1:{filter_port}",
            "PRIVACY_FILTER_MASTER_KEY": fake_privacy_filter.api_key,
            # One port, the one the banner's URLs name (/metrics and /admin included).
            "MLPA_ADMIN_PORT": "",
        }
        settings = Settings.from_environ(environ, demo=True)
        # The fake keeps LiteLLM's budget rows and spend, so /user/<id> (LiteLLM's view) and
        # /v1/usage (the store's) agree: the tiers the service writes at start, and each
        # completion's cost added to the in-memory store's row as LiteLLM adds it to its table.
        for tier in settings.budgets.values():
            litellm_customers.add_budget(
                tier.budget_id, max_budget=tier.max_budget, budget_duration=tier.budget_duration,
                tpm_limit=tier.tpm_limit, rpm_limit=tier.rpm_limit,
            )
        service_app = create_app(settings)
        service_runner, service_port = await _start(service_app, "127.0.0.1", port)
        runners.insert(0, service_runner)
        store = service_app[keys.STORE]
        assert isinstance(store, MemoryUserStore)  # the demo's MLPA_STORE
        fake_litellm.spend_sink = store.add_spend
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
            (
                f"  curl {base}/privacy-filter -H 'authorization: Bearer {token}' -H 'content-type: application/json'"
                " -d '{\"items\": [\"mail jane@example.com\"]}'   (fake Privacy Filter)"
            ),
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
    if server.done() and not server.cancelled() and (failure := server.exception()) is not None:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        raise failure  # the port could not be bound: one message, not a "listening" lie
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
    settings = Settings.from_environ(os.environ, check_secrets=False)
    configure_logging(level=settings.server.log_level, json=settings.server.log_json)
    warn_about_environment(os.environ, variable_names())
    return migrate_command(settings, role_timeouts=not args.skip_role_timeouts)


def migrate_command(settings: Settings, *, role_timeouts: bool = True) -> int:
    """The body of `migrate`: one log line per migration applied and one summary (in the log
    format, JSON with LOG_JSON=true); exit status 69 when PostgreSQL fails."""
    from .store.migrate import migrate

    pg = settings.postgres
    try:
        applied = asyncio.run(migrate(settings, role_timeouts=role_timeouts))
    except StoreUnavailable as exc:
        hint = (
            "start PostgreSQL or correct DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD (DB_SSL_MODE, DB_SSL_ROOT_CERT for TLS); "
            f"the user needs CREATEDB to create {pg.app_attest_db_name!r}"
        )
        return report_unavailable("database", exc, os.environ, hint=hint, exit_code=EXIT_UNAVAILABLE)
    # Under the migrations' own logger, like the line of each migration applied.
    structlog.get_logger("mlpa_aiohttp.store.migrate").info(
        "migrate_done",
        database=pg.app_attest_db_name,
        server=f"{pg.host}:{pg.port}",
        applied=len(applied),
        max_signed_in_users=settings.signup_cap.max_signed_in_users,
    )
    return 0


# -- catalog ---------------------------------------------------------------------------------

CATALOG_CHECK_TEXT = f"""environment:
  none; FILE is the only input.

exit statuses:
  0   the file is a valid catalogue (a summary is printed)
  2   command-line usage error
  {EXIT_CONFIG}  the file is not valid: every problem is listed in one message"""

CATALOG_SHOW_TEXT = f"""environment:
  MLPA_CATALOG_FILE (unset: the built-in catalogue), then the USER_FEATURE_BUDGET_<T>_*
  variables of each service type <T> and MLPA_CAPPED_SERVICE_TYPES, applied as the
  service applies them; LOG_JSON for the format of an error.

exit statuses:
  0   the effective catalogue is printed (TOML, readable as a catalogue file)
  2   command-line usage error
  {EXIT_CONFIG}  the file or one of those variables is not valid: every problem is listed"""

CATALOG_CHECKSUM_TEXT = f"""environment:
  none; FILE is the only input. The checksum is the SHA-256 of the file's bytes (what
  sha256sum prints), for the Deployment's mlpa.mozilla.org/catalog-sha256 annotation:
  a new value rolls the pods (docs/catalog.md, "Kubernetes").

exit statuses:
  0   the file is a valid catalogue; its checksum is printed
  2   command-line usage error
  {EXIT_CONFIG}  the file is not valid: every problem is listed, no checksum is printed"""

CATALOG_HINT = "docs/catalog.md describes the file; config/catalog.toml is the built-in catalogue"
# Problems of the settings that are about the catalogue (`catalog show` reports only those).
_CATALOG_PROBLEM_PREFIXES = ("MLPA_CATALOG_FILE", "USER_FEATURE_BUDGET_", "MLPA_CAPPED_SERVICE_TYPES")


def _add_catalog(commands: argparse._SubParsersAction) -> None:
    summary = "check a catalogue file, or show the catalogue the service would use (docs/catalog.md)"
    catalog = commands.add_parser(
        "catalog",
        help=summary,
        description=summary,
        epilog=f"{PROG} catalog check --help and catalog show --help name what each reads.\n\n{exit_statuses_text((EXIT_CONFIG,))}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = catalog.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")
    for name, help_text, epilog, run in (
        ("check", "validate a catalogue file; every problem in one message", CATALOG_CHECK_TEXT, _run_catalog_check),
        ("show", "print the effective catalogue (file and variables applied) as TOML", CATALOG_SHOW_TEXT, _run_catalog_show),
        ("checksum", "print a valid catalogue file's SHA-256 (the pod template annotation)", CATALOG_CHECKSUM_TEXT, _run_catalog_checksum),
    ):
        action = actions.add_parser(
            name, help=help_text, description=help_text, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        action.set_defaults(run=run)
        if name != "show":
            action.add_argument("file", metavar="FILE", help="the TOML catalogue file")


def _checked_catalog(path: str):
    """The catalogue in `path`, or None once every problem is reported."""
    from .catalog.file import CatalogError, load_catalog
    from .observability.logging import log_startup_failure
    from .process.startup import json_logs_requested

    try:
        return load_catalog(path)
    except CatalogError as error:
        problems = [f"{path}: {problem}" for problem in error.problems]
        log_startup_failure(
            "catalog_invalid", problems, exit_code=EXIT_CONFIG, hint=CATALOG_HINT, json=json_logs_requested(os.environ)
        )
        return None


def _run_catalog_checksum(args: argparse.Namespace) -> int:
    import hashlib

    if _checked_catalog(args.file) is None:
        return EXIT_CONFIG
    with open(args.file, "rb") as file:
        print(hashlib.sha256(file.read()).hexdigest())
    return 0


def _run_catalog_check(args: argparse.Namespace) -> int:
    catalog = _checked_catalog(args.file)
    if catalog is None:
        return EXIT_CONFIG
    print(
        f"{args.file}: a valid catalogue: {len(catalog.names)} service types, {len(catalog.search_types)} of them"
        f" search types, {len(catalog.all_purposes)} purposes, {len(catalog.models)} models"
        f" ({len(catalog.pinned_models)} pinned)"
    )
    return 0


def _run_catalog_show(args: argparse.Namespace) -> int:
    from .catalog.file import render_catalog
    from .observability.logging import log_startup_failure
    from .process.startup import json_logs_requested

    reading = Settings.read_environ(os.environ, check_secrets=False)
    problems = [problem for problem in reading.problems if problem.startswith(_CATALOG_PROBLEM_PREFIXES)]
    if problems:
        log_startup_failure(
            "catalog_invalid", problems, exit_code=EXIT_CONFIG, hint=CATALOG_HINT, json=json_logs_requested(os.environ)
        )
        return EXIT_CONFIG
    source = os.environ.get("MLPA_CATALOG_FILE", "").strip() or "the built-in catalogue"
    print(f"# The effective catalogue: {source}, with the environment's budget and capped-type variables applied.")
    print(render_catalog(reading.settings.catalog), end="")
    return 0


# -- config ----------------------------------------------------------------------------------

CONFIG_VARIABLES = """environment:
  none: it prints every variable with its default, not the values set. Made from
  mlpa_aiohttp/settings/__init__.py; docs/configuration.md and config/example.env are its output."""


def _add_config(commands: argparse._SubParsersAction) -> None:
    config = _subcommand(
        commands,
        "config",
        "print the configuration reference: every variable's name, default and meaning",
        CONFIG_VARIABLES,
        _run_config,
        exits=(),
    )
    form = config.add_mutually_exclusive_group(required=True)
    form.add_argument("--markdown", action="store_true", help="as docs/configuration.md")
    form.add_argument("--env", action="store_true", help="as an env file, config/example.env")


def _run_config(args: argparse.Namespace) -> int:
    from .settings.reference import example_env, reference_markdown

    sys.stdout.write(reference_markdown(EXIT_CONFIG) if args.markdown else example_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
