"""The production configuration as a bench target: what config/kubernetes runs, so that a
figure quoted for the service is the one a pod pays.

    with production_configuration(work_dir) as production:
        env = production.environ(port, upstream_port, fxa_port)                 # every part
        env = production.environ(port, upstream_port, fxa_port, ("postgres",))  # some parts

On top of the benches' service environment (targets.service_environ), always: the default
level (`LOG_LEVEL=info`, every request's line written) and `MLPA_DEBUG=false` with the
secrets it then requires (the dev tier off, as production has it). The parts, each
measurable on its own (`PRODUCTION_PARTS`, in the order the benches add them):

  postgres   `MLPA_STORE=postgres` on a throwaway PostgreSQL started as the tests start it
             (tests/support/postgres.py), through the service's pools: one round trip
             (`get_user`) per request. The bench's caller exists beforehand, created by the
             store's own `create_user`, LiteLLM's /customer/new written straight into its table:
             the paced upstream writes no LiteLLM table, so a first-sight creation would fail.
  multiproc  `PROMETHEUS_MULTIPROC_DIR` (a fresh directory for each service process): every
             metric's value in prometheus-client's memory-mapped files.
  json       `LOG_JSON=true`: each line as JSON instead of the console's `key=value`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from mlpa_aiohttp.settings import Settings
from mlpa_aiohttp.store.pools import open_pools
from mlpa_aiohttp.store.postgres import PostgresUserStore
from mlpa_aiohttp.testing.fake_fxa import DEMO_UID

from mlpa_aiohttp.testing.litellm_schema import EndUserTable

from ..support.postgres import DirectCustomerCreator, ThrowawayPostgres, database_environ, prepare_databases
from .targets import REPO_ROOT, service_environ

PRODUCTION_PARTS = ("postgres", "multiproc", "json")
# The bench's requests send `Service-Type: ai` with the fake FxA's demo token.
BENCH_SERVICE_TYPE = "ai"
# Production refuses the documented defaults of these (settings.DEFAULT_SECRETS); an empty
# experimentation token is how production turns the dev tier off.
PRODUCTION_SECRETS = {
    "MLPA_UI_ACCESS_KEY": "bench-ui-access-key",
    "MLPA_ACCESS_TOKEN_SECRET": "bench-access-token-secret-of-at-least-32-bytes",
    "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": "",
    # The bench runs no iOS or Android client: said explicitly, as production must (D63).
    "APP_ATTEST_ENABLED": "false",
    "PLAY_INTEGRITY_ENABLED": "false",
}


class ProductionConfiguration:
    def __init__(self, work_dir: Path, database: Mapping[str, str]) -> None:
        self._work_dir = work_dir
        self._database = dict(database)
        self._directories = itertools.count()

    def environ(
        self, port: int, upstream_port: int, fxa_port: int, parts: Sequence[str] = PRODUCTION_PARTS,
        root: Path = REPO_ROOT,
    ) -> dict[str, str]:
        unknown = set(parts) - set(PRODUCTION_PARTS)
        if unknown:
            raise ValueError(f"unknown parts {sorted(unknown)}; choose from {', '.join(PRODUCTION_PARTS)}")
        env = service_environ(port, upstream_port, fxa_port, root)
        env.update(MLPA_DEBUG="false", LOG_LEVEL="info", **PRODUCTION_SECRETS)
        if "postgres" in parts:
            env.update(self._database)
        if "multiproc" in parts:
            directory = self._work_dir / f"prometheus-{next(self._directories)}"
            directory.mkdir()
            env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
        if "json" in parts:
            env["LOG_JSON"] = "true"
        return env


@contextmanager
def production_configuration(work_dir: Path) -> Iterator[ProductionConfiguration]:
    """A throwaway PostgreSQL with its databases prepared and the bench's caller created, for
    the lifetime of the block."""
    with ThrowawayPostgres() as server:
        pg = server.settings()
        asyncio.run(_prepare(Settings(postgres=pg)))
        yield ProductionConfiguration(work_dir, database_environ(pg))


async def _prepare(settings: Settings) -> None:
    await prepare_databases(settings.postgres)
    table = await EndUserTable.open(settings.postgres)
    try:
        async with open_pools(settings.postgres) as pools:
            store = PostgresUserStore.from_settings(pools, DirectCustomerCreator(table), settings)
            # What the service does at its start (the end user's budget must exist first).
            await store.ensure_budgets(settings.budgets)
            user = await store.create_user(
                f"{DEMO_UID}:{BENCH_SERVICE_TYPE}", settings.budgets[BENCH_SERVICE_TYPE].budget_id
            )
    finally:
        await table.close()
    if user is None:
        raise RuntimeError("the bench's end user is not in LiteLLM's table after its creation")
