"""How a relayed completion ended: one value per request, and the one place that turns it
into the outcome's metrics, the stream's final frame and the request line's fields.

Each relay decides its ending once, from where it stands when the request ends: the stream
relay (`relay/stream.py`) and the JSON relay (`relay/json_relay.py`) call `record` exactly
once, then render (`final_frame`, or the JSON relay's error body). The request-context
middleware reads the ending back from the request (`ENDING`) for its log line, and
`request_line` says what that line carries.

The endings:

* `Completed`: LiteLLM's answer went through whole;
* `Rejected`: LiteLLM refused for a reason clients get a code for (`upstream/classify.py`);
* `UpstreamFailed`: an unclassified answer, LiteLLM not reached, its stream cut or empty;
* `Silenced`: the silence watch ended a stream whose upstream sent nothing for too long;
* `ShutDown`: shutdown ended it (the shutdown frame, or the runner's cancellation);
* `ClientLeft`: the client went away, with the reason (`relay/disconnect.py`).

The ending is decided before any final frame is written; a client that leaves while its
frame is written does not change what happened upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..errors import GENERIC_UPSTREAM_MESSAGE, Classification
from ..upstream.routing import RoutingInfo
from . import sse
from .disconnect import client_hung_up, disconnect_reason
from .judgment import Unclassified
from .outcome import CompletionOutcome, Usage


@dataclass(frozen=True, slots=True)
class Completed:
    usage: Usage
    routing: RoutingInfo


@dataclass(frozen=True, slots=True)
class Rejected:
    classification: Classification
    # Reported inside LiteLLM's 200 stream: the client has the event already, no frame.
    in_band: bool = False


@dataclass(frozen=True, slots=True)
class UpstreamFailed:
    error: Unclassified
    # The availability reason: `upstream_error`, or `empty_response` for an empty stream.
    reason: str = "upstream_error"
    in_band: bool = False


@dataclass(frozen=True, slots=True)
class Silenced:
    error: Unclassified


@dataclass(frozen=True, slots=True)
class ShutDown:
    pass


@dataclass(frozen=True, slots=True)
class ClientLeft:
    # `client_closed`, `client_reset` or `client_timeout` (relay/disconnect.py).
    reason: str
    # What the client's stream got before it left (docs/stream-errors-and-aborts.md).
    relayed: sse.StreamAccountant | None = None


Ending = Completed | Rejected | UpstreamFailed | Silenced | ShutDown | ClientLeft

# The request's ending, set by `record`; read by the request-context middleware.
ENDING: web.RequestKey[Ending] = web.RequestKey("relay_ending")


def record(
    request: web.BaseRequest, outcome: CompletionOutcome, ending: Ending, relayed: sse.StreamAccountant | None = None
) -> None:
    """The ending's metrics and the outcome's log fields, once per request; with traffic
    contracts, the request's count (`relayed`: what a stream relayed, however it ended)."""
    request[ENDING] = ending
    if outcome.count_after_upstream is not None:
        outcome.count_after_upstream(*_contract_tokens(ending, relayed))
    if isinstance(ending, Completed):
        outcome.succeeded(ending.usage, ending.routing)
    elif isinstance(ending, Rejected):
        outcome.rejected(ending.classification)
    elif isinstance(ending, UpstreamFailed):
        outcome.failed(ending.reason)
    elif isinstance(ending, Silenced):
        outcome.failed()
    elif isinstance(ending, ShutDown):
        outcome.failed("server_shutdown")
    else:
        outcome.aborted(ending.relayed)


def _contract_tokens(ending: Ending, relayed: sse.StreamAccountant | None) -> tuple[int, int | None]:
    """(LiteLLM's total_tokens, or 0 without a usage object; a stream's content deltas)."""
    if isinstance(ending, Completed) and ending.usage.total_tokens:
        total = ending.usage.total_tokens
    elif relayed is not None and relayed.usage_seen:
        total = relayed.total_tokens
    else:
        total = 0
    return total, relayed.content_deltas if relayed is not None else None


def refused(verdict: Classification | Unclassified, *, in_band: bool = False) -> Ending:
    """The ending for LiteLLM's error answer, as `relay/judgment.judge_response` judged it."""
    if isinstance(verdict, Classification):
        return Rejected(verdict, in_band=in_band)
    return UpstreamFailed(verdict, in_band=in_band)


def of_cancellation(request: web.BaseRequest, relayed: sse.StreamAccountant | None = None) -> Ending:
    """Who cancelled the handler: the client's hang-up, or this side, and in this service
    only shutdown does (`relay/disconnect.client_hung_up` tells them apart)."""
    if client_hung_up(request):
        return ClientLeft(disconnect_reason(request), relayed)
    return ShutDown()


def final_frame(ending: Ending, *, debug: bool, relayed: sse.StreamAccountant) -> bytes | None:
    """The stream's last event of our own, if the ending has one."""
    if isinstance(ending, Rejected) and not ending.in_band:
        frame = sse.event({"error": ending.classification.code})
    elif isinstance(ending, (UpstreamFailed, Silenced)) and not getattr(ending, "in_band", False):
        error = ending.error
        frame = sse.event({"code": error.status, "error": error.detail if debug else GENERIC_UPSTREAM_MESSAGE})
    elif isinstance(ending, ShutDown):
        frame = sse.SHUTDOWN_EVENT
    else:
        return None
    return sse.after_relayed(relayed, frame)


# The request line's events, and the statuses a cancelled handler's line carries.
CLIENT_DISCONNECTED = "client_disconnected"
ENDED_BY_SHUTDOWN = "ended_by_shutdown"
COMPLETED_EVENT = "request"
CLIENT_CLOSED_REQUEST = 499  # nginx's "client closed request"
SHUTTING_DOWN = 503  # as in the shutdown frame, `{"code": 503, "error": "Server shutting down"}`


def request_line(request: web.BaseRequest, *, cancelled: bool) -> tuple[str, int | None, dict[str, Any]]:
    """(event, status for a cancelled handler, extra fields) of the request's log line.

    A cancelled handler's line says who cancelled it: the relay's ending if it was the
    cancellation's (client or shutdown), else the cancellation itself (it came before a
    relay decided, or while a final frame was written)."""
    ending = request.get(ENDING)
    if cancelled and not isinstance(ending, (ClientLeft, ShutDown)):
        ending = of_cancellation(request)
    if isinstance(ending, ClientLeft):
        fields = {"client_disconnected": True, "disconnect_reason": ending.reason}
        return CLIENT_DISCONNECTED, CLIENT_CLOSED_REQUEST if cancelled else None, fields
    if cancelled:
        return ENDED_BY_SHUTDOWN, SHUTTING_DOWN, {}
    return COMPLETED_EVENT, None, {}
