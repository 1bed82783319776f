"""Every typed `web.AppKey` of the application, on one screen.

Only assembly (`app.py`), routes and middlewares read these; the layers below receive
their collaborators as arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from .auth.app_attest import AppAttest
from .auth.dispatch import Authenticator
from .auth.play import PlayIntegrity
from .fleet.redis_link import RedisLink
from .fleet.stream_cap import FleetStreamCap
from .fleet.traffic_contracts import TrafficContracts
from .models import RequestRules
from .observability.metrics import Metrics
from .observability.timing import RequestTimings
from .relay.keepalive import FirstByteKeepAlive
from .relay.stream import TakeOver
from .relay.tracker import StreamTracker
from .settings import Settings
from .store.base import UserStore
from .store.budget_links import BudgetLinks
from .store.pools import Pools
from .store.provisioning import Provisioner
from .store.schema import SchemaWatch
from .stream_slots import StreamSlots
from .upstream.litellm import LiteLLMClient
from .upstream.privacy_filter import PrivacyFilterClient

if TYPE_CHECKING:
    # process/overload.py is a middleware module (it imports aiohttp.web): named for the type only.
    from .process.overload import LoadMonitor

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
STREAMS = web.AppKey("streams", StreamTracker)
STREAM_SLOTS = web.AppKey("stream_slots", StreamSlots)
# The loaded catalogue's header models and checks (Settings.catalog).
REQUEST_RULES = web.AppKey("request_rules", RequestRules)
# Only present when STREAM_KEEPALIVE_SECONDS > 0.
STREAM_KEEPALIVE = web.AppKey("stream_keepalive", FirstByteKeepAlive)
# The relay fast path's entry, or None: RELAY_FAST_PATH off, or this aiohttp fenced it off.
RELAY_FAST_PATH: web.AppKey[TakeOver] = web.AppKey("relay_fast_path")
# Only present when OVERLOAD_PROTECTION is on.
OVERLOAD: web.AppKey[LoadMonitor] = web.AppKey("overload")
HTTP_SESSION = web.AppKey("http_session", aiohttp.ClientSession)
LITELLM = web.AppKey("litellm", LiteLLMClient)
PG_POOLS = web.AppKey("pg_pools", Pools)
STORE = web.AppKey("store", UserStore)
# The app database's schema against this release's migrations; only with the PostgreSQL store.
SCHEMA_WATCH = web.AppKey("schema_watch", SchemaWatch)
# Budget rows and users' links to them, repaired when LiteLLM's foreign key finds a row gone.
BUDGET_LINKS = web.AppKey("budget_links", BudgetLinks)
PROVISIONER = web.AppKey("provisioner", Provisioner)
APP_ATTEST = web.AppKey("app_attest", AppAttest)
PLAY_INTEGRITY = web.AppKey("play_integrity", PlayIntegrity)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
# The Privacy Filter service (`POST /privacy-filter`, readiness), on HTTP_SESSION.
PRIVACY_FILTER = web.AppKey("privacy_filter", PrivacyFilterClient)
# Per request (middlewares.request_timings): its spans when it sent `debug-timing: true`, else
# None. Always set, so reading it is a plain lookup (a missing key would raise and catch).
REQUEST_TIMINGS: web.RequestKey[RequestTimings | None] = web.RequestKey("request_timings")
# Only present when a feature uses Redis (app.uses_redis): the worker's one link.
REDIS = web.AppKey("redis", RedisLink)
# Only present when ENABLE_TRAFFIC_CONTRACT_ENFORCEMENT is on.
TRAFFIC_CONTRACTS = web.AppKey("traffic_contracts", TrafficContracts)
# A request's (RPM, TPM) traffic-contract modes, set by the check; absent: ("N/A", "N/A").
TRAFFIC_CONTRACT_MODES: web.RequestKey[tuple[str, str]] = web.RequestKey("traffic_contract_modes")
# Only with STREAM_CAP_SCOPE=fleet and a cap: the fleet-wide count over STREAM_SLOTS.
FLEET_STREAM_CAP = web.AppKey("fleet_stream_cap", FleetStreamCap)
