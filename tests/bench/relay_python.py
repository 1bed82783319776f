"""The fast path's own Python per relayed event, without the socket: what the relay would
save per event if its code cost nothing (docs/performance.md, "Floors, limits and options").

`FastRelay.relay` is called as the upstream parser calls it, once per SSE event, with a
client transport whose `write` does nothing; what is timed is the relay's bytecode, its
chunked framing, `Delivery.delivered` and the accountant's `feed`. Subtract it from the
benchmark's CPU per event (`open_streams --phases chunk`) and what is left is the path
under the relay: uvloop's read callback, aiohttp's `ResponseHandler.data_received` and C
parser, the kernel's read and write.

    PYTHONPATH=. python -m tests.bench.relay_python [--repeat 7]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable

from mlpa_aiohttp.relay.delivery import Delivery
from mlpa_aiohttp.relay.fast_path import FastRelay
from mlpa_aiohttp.relay.sse import StreamAccountant
from mlpa_aiohttp.relay.tracker import OpenStream

# One content delta as LiteLLM sends it (the fake upstream's shape, 218 bytes).
EVENT = (
    b'data: {"id":"chatcmpl-8ccd860732344ac6999c7a23016d31df","created":1796168318,"model":"gpt-oss-120b",'
    b'"object":"chat.completion.chunk","system_fingerprint":"fp_fake",'
    b'"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
)
CALLS = 200_000


class _DiscardingTransport:
    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass


class _NeverPausedProtocol:
    writing_paused = False


def relay_in_flight() -> tuple[FastRelay, Delivery]:
    """A relay past its take-over, as `FastRelay.relay` finds it for every event."""
    delivery = Delivery(OpenStream(lambda *_: None), StreamAccountant(), lambda: None)
    relay = FastRelay.__new__(FastRelay)
    state = {
        "_taking_over": False,
        "_failure": None,
        "_ended": False,
        "_paused": False,
        "_written": 0,
        "_client_transport": _DiscardingTransport(),
        "_client_protocol": _NeverPausedProtocol(),
        "_delivered": delivery.delivered,
    }
    for name, value in state.items():
        setattr(relay, name, value)
    return relay, delivery


def microseconds_per_call(call: Callable[[], object], repeat: int) -> float:
    return min(timeit.repeat(call, number=CALLS, repeat=repeat)) / CALLS * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.relay_python")
    parser.add_argument("--repeat", type=int, default=7, help="timing runs; the fastest is reported")
    args = parser.parse_args()
    relay, delivery = relay_in_flight()
    empty = microseconds_per_call(lambda: None, args.repeat)
    whole = microseconds_per_call(lambda: relay.relay(EVENT), args.repeat) - empty
    feed = microseconds_per_call(lambda: delivery._feed(EVENT), args.repeat) - empty
    print(f"FastRelay.relay, one {len(EVENT)}-byte event, write discarded: {whole:.2f} µs per event")
    print(f"  of it the accountant's feed: {feed:.2f} µs")
    print(f"  the rest (checks, framing, byte count, first-byte check): {whole - feed:.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
