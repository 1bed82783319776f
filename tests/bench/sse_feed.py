"""Per-read cost of the SSE accountant (`StreamAccountant.feed`) on LiteLLM-shaped events.

Prints the best-of-5 mean in ns per feed, three times, for one content event per read and
for a read of eight events. Compare two trees by running it with each on PYTHONPATH:

    PYTHONPATH=/tmp/base python -m tests.bench.sse_feed base   # from /tmp/base
    PYTHONPATH=. python -m tests.bench.sse_feed branch
"""

from __future__ import annotations

import sys
import timeit

from mlpa_aiohttp.relay.sse import StreamAccountant

CONTENT_EVENT = (
    b'data: {"id":"chatcmpl-fake123","created":1796053380,"model":"gpt-oss-120b",'
    b'"object":"chat.completion.chunk","system_fingerprint":"fp_fake",'
    b'"choices":[{"index":0,"delta":{"content":" there"}}]}\n\n'
)
FEEDS = 200_000


def ns_per_feed(chunk: bytes) -> float:
    accountant = StreamAccountant()
    return min(timeit.repeat(lambda: accountant.feed(chunk), number=FEEDS, repeat=5)) / FEEDS * 1e9


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this tree"
    for name, chunk in (("1 event/read", CONTENT_EVENT), ("8 events/read", CONTENT_EVENT * 8)):
        runs = [round(ns_per_feed(chunk), 1) for _ in range(3)]
        print(f"{label}: {name}: ns per feed {runs}")


if __name__ == "__main__":
    main()
