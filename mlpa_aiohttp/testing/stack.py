"""`python -m mlpa_aiohttp stack`: DEVELOPMENT ONLY - everything around the service, faked.

Starts, on loopback:

* the fake LiteLLM, with fresh random keys, writing the end users it creates into
  `"LiteLLM_EndUserTable"` of the PostgreSQL database the `DB_*` / `LITELLM_DB_NAME`
  variables name (LiteLLM's own migrations are applied there first, as a real LiteLLM applies
  them at start; a database a real LiteLLM has migrated is refused);
* the fake Firefox Accounts server, and mints an FxA access token with its signing key;
* with `--traffic-contracts`, a throwaway `redis-server` (nothing persisted) for the traffic
  contracts, which the export lines turn on (`ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT=true`).

Then prints the keys, the token and the `export` lines the service needs (also written to
`--env-file`, mode 0600, removed again when the stack stops: the keys die with it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import redis.asyncio as redis
from aiohttp import web

from ..observability.logging import configure_logging
from ..settings import PostgresSettings, Settings
from .fake_fxa import API_PREFIX, FakeFxA
from .fake_litellm import FakeLiteLLM
from .litellm_schema import EndUserTable, LiteLLMSchemaUnavailable, RealLiteLLMDatabase, apply_litellm_schema

# Not a service variable: the FxA access token for the newcomer's curl.
TOKEN_VARIABLE = "FXA_TOKEN"
CHAT_BODY = '{"model": "gpt-oss-120b", "stream": true, "messages": [{"role": "user", "content": "Hello!"}]}'
BANNER = (
    "DEVELOPMENT ONLY: fake LiteLLM and fake Firefox Accounts with throwaway keys, on a database "
    "of LiteLLM's schema that this command owns. Never point this at production."
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n", 1)[1] if __doc__ else None
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "reads DB_HOST, DB_PORT, DB_USERNAME, DB_PASSWORD, LITELLM_DB_NAME, APP_ATTEST_DB_NAME "
        "(defaults as for the service); the role needs CREATEDB when the database is missing"
    )
    parser.add_argument("--host", default="127.0.0.1", help="where the fakes listen (default 127.0.0.1)")
    parser.add_argument("--litellm-port", type=int, default=0, help="fake LiteLLM port (default: any free port)")
    parser.add_argument("--fxa-port", type=int, default=0, help="fake FxA port (default: any free port)")
    parser.add_argument("--env-file", type=Path, help="also write the export lines here (mode 0600)")
    parser.add_argument("--uid", default="newcomer", help="FxA user id of the minted token (default newcomer)")
    parser.add_argument("--token-hours", type=float, default=24.0, help="lifetime of the minted token")
    parser.add_argument(
        "--traffic-contracts",
        action="store_true",
        help="also start a throwaway redis-server (from PATH) and turn traffic contracts on in the export lines;"
        " for a Redis of your own, export REDIS_HOST, REDIS_PORT and ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT=true instead",
    )


def stack_command(args: argparse.Namespace) -> int:
    settings = Settings.from_environ(os.environ, check_secrets=False)  # only the DB_* part is used
    configure_logging(level="WARNING", json=False)
    return asyncio.run(_run(args, settings.postgres))


def _exports(values: dict[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())


def _write_private(path: Path, text: str) -> None:
    # Written whole under a temporary name, then renamed: a reader never sees half a file.
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(partial, path)


async def _start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])


class ThrowawayRedisUnavailable(RuntimeError):
    pass


REDIS_START_SECONDS = 10.0


class StackRedis:
    """A `redis-server` on a free port of `host`, persisting nothing (`save ""`, no AOF, its
    working directory a temporary one), for the traffic contracts of a development stack."""

    def __init__(self, process: asyncio.subprocess.Process, host: str, port: int, directory: str) -> None:
        self.process, self.host, self.port, self._directory = process, host, port, directory

    @classmethod
    async def start(cls, host: str) -> StackRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ThrowawayRedisUnavailable(
                "redis-server is not on PATH (Debian/Ubuntu: apt-get install redis-server); or leave out"
                " --traffic-contracts and export REDIS_HOST, REDIS_PORT and ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT=true"
                " for a Redis of your own"
            )
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
        directory = tempfile.mkdtemp(prefix="mlpa-stack-redis-")
        process = await asyncio.create_subprocess_exec(
            binary, "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", directory,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        server = cls(process, host, port, directory)
        try:
            await server._answering()
        except BaseException:
            await server.stop()
            raise
        return server

    async def _answering(self) -> None:
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + REDIS_START_SECONDS
        try:
            while True:
                if self.process.returncode is not None:
                    raise ThrowawayRedisUnavailable(f"redis-server exited at start (status {self.process.returncode})")
                try:
                    await client.ping()
                    return
                except (redis.RedisError, OSError):
                    if time.monotonic() > deadline:
                        raise ThrowawayRedisUnavailable(
                            f"redis-server did not answer on {self.host}:{self.port} within {REDIS_START_SECONDS:g} s"
                        ) from None
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        shutil.rmtree(self._directory, ignore_errors=True)

    def exports(self) -> dict[str, str]:
        return {"REDIS_HOST": self.host, "REDIS_PORT": str(self.port), "ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT": "true"}


async def _run(args: argparse.Namespace, pg: PostgresSettings) -> int:
    print(BANNER, file=sys.stderr, flush=True)
    where = f"PostgreSQL at {pg.host}:{pg.port} as {pg.username!r}, database {pg.litellm_db_name!r}"
    try:
        schema = await apply_litellm_schema(pg)
        end_users = await EndUserTable.open(pg)
    except (RealLiteLLMDatabase, LiteLLMSchemaUnavailable) as exc:
        print(f"stack: refused: {exc}", file=sys.stderr)
        return 1
    except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
        print(
            f"stack: cannot prepare LiteLLM's schema on {where}: {type(exc).__name__}: {exc}\n"
            "  (the DB_* variables name the server and role; the role needs CREATEDB, see README"
            ' "Running it for real")',
            file=sys.stderr,
        )
        return 1
    print(
        f"LiteLLM's schema ready on {where}: {'new' if schema.database_created else 'existing'} database, "
        f"{schema.migrations_applied} of LiteLLM's {schema.migrations_known} migrations applied now"
    )

    fake_litellm = FakeLiteLLM(
        virtual_key=f"sk-fake-virtual-{secrets.token_hex(12)}",
        master_key=f"sk-fake-master-{secrets.token_hex(12)}",
        interval=0.05,
        chunks=20,
        customer_table=end_users,
        keep_requests=1000,
    )
    fake_fxa = FakeFxA(register_demo_token=False)
    runners: list[web.AppRunner] = []
    stack_redis: StackRedis | None = None
    try:
        if args.traffic_contracts:
            try:
                stack_redis = await StackRedis.start(args.host)
            except ThrowawayRedisUnavailable as exc:
                print(f"stack: {exc}", file=sys.stderr)
                return 1
            print(f"throwaway Redis on {stack_redis.host}:{stack_redis.port} (nothing persisted): traffic contracts on")
        litellm_runner, litellm_port = await _start(fake_litellm.make_app(), args.host, args.litellm_port)
        runners.append(litellm_runner)
        fxa_runner, fxa_port = await _start(fake_fxa.make_app(), args.host, args.fxa_port)
        runners.append(fxa_runner)
        token = fake_fxa.issue_jwt(args.uid, expires_in=args.token_hours * 3600)
        exports = {
            "LITELLM_API_BASE": f"http://{args.host}:{litellm_port}",
            "MLPA_VIRTUAL_KEY": fake_litellm.virtual_key,
            "MASTER_KEY": fake_litellm.master_key,
            "FXA_BASE_URL": f"http://{args.host}:{fxa_port}{API_PREFIX}",
            "MLPA_UI_ACCESS_KEY": f"sk-ui-{secrets.token_hex(12)}",
            "MLPA_ACCESS_TOKEN_SECRET": secrets.token_urlsafe(48),
            "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": secrets.token_urlsafe(24),
            # No fake Apple or Google here: the service runs without iOS and Android clients,
            # said explicitly as production must (compatibility.md D63).
            "APP_ATTEST_ENABLED": "false",
            "PLAY_INTEGRITY_ENABLED": "false",
            **pg.connection_environ(),
            **(stack_redis.exports() if stack_redis is not None else {}),
            TOKEN_VARIABLE: token,
        }
        text = _exports(exports)
        print(f"fake LiteLLM on {exports['LITELLM_API_BASE']}  virtual key {fake_litellm.virtual_key}  master key {fake_litellm.master_key}")
        print(f"fake FxA on {exports['FXA_BASE_URL']}  access token for uid {args.uid!r} (valid {args.token_hours:g} h) in ${TOKEN_VARIABLE}")
        print("export these where the service and the client run:")
        print(text, end="")
        if args.env_file is not None:
            _write_private(args.env_file, text)
            # `.` looks a bare name up on PATH: a relative file needs its ./
            sourced = str(args.env_file) if args.env_file.is_absolute() else f"./{args.env_file}"
            print(f"(also written to {args.env_file}: `. {shlex.quote(sourced)}`)")
        print(
            "then: gunicorn -c config/gunicorn.conf.py mlpa_aiohttp.app:app_factory, and\n"
            f'  curl -N http://127.0.0.1:${{PORT:-8080}}/v1/chat/completions -H "authorization: Bearer ${TOKEN_VARIABLE}" '
            f"-H 'service-type: ai' -H 'content-type: application/json' -d '{CHAT_BODY}'"
        )
        print("stack ready; Ctrl-C stops it", flush=True)
        await _wait_for_signal()
    finally:
        if args.env_file is not None:
            args.env_file.unlink(missing_ok=True)
        for runner in reversed(runners):
            await runner.cleanup()
        if stack_redis is not None:
            await stack_redis.stop()
        await end_users.close()
    return 0


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
