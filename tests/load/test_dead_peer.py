"""Dead-peer detection for real: a client in its own network namespace vanishes mid-stream
(its end of a veth pair goes down: no FIN, no RST) and the service, with short dead-peer
settings, closes the upstream request within the bound and logs one abort saying why."""

from __future__ import annotations

import pytest

from .dead_peer import BOUND_SECONDS, run_in_namespaces, unavailable_reason

_UNAVAILABLE = unavailable_reason()
needs_namespaces = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"dead-peer test: {_UNAVAILABLE}")
CLIENTS = ("vanish-streaming", "vanish-idle")


@needs_namespaces
def test_a_vanished_client_is_an_abort_within_the_bound():
    figures = run_in_namespaces(short_settings=True)
    print(f"\n{figures}")
    for request_id in CLIENTS:
        closed_after = figures["upstream_closed_after_seconds"][request_id]
        assert closed_after is not None and closed_after <= BOUND_SECONDS + 0.5, figures
        assert figures["canonical"][request_id] == [
            {"event": "client_disconnected", "result": "abort", "disconnect_reason": "client_timeout", "status": 499}
        ]
    assert figures["errors"] == []


@needs_namespaces
def test_without_the_short_settings_the_vanished_client_is_still_streaming():
    """The control: with the defaults (a 130 s bound) nothing ends the streams in 6 s, so
    the figures above come from the dead-peer options."""
    figures = run_in_namespaces(short_settings=False)
    print(f"\n{figures}")
    assert figures["upstream_closed_after_seconds"] == {request_id: None for request_id in CLIENTS}
