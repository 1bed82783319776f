"""A request leaves no reference cycle behind: everything it made is freed by reference
counting when it ends, none of it waits for the garbage collector.

Why it matters (docs/performance.md, "The garbage collector"): a finished stream kept
alive by a cycle (relay -> tracker handle -> the relay's bound method) survives young
collections, is promoted, and soon makes the collector walk every open stream in a full
collection that holds the event loop for 100-250 ms with 1,000 streams open.

Measured over real HTTP with `gc.DEBUG_SAVEALL`: what the collector finds unreachable
after a few requests of each kind (completed stream, JSON completion, a stream the client
hangs up on after its first byte). The test runs on asyncio's selector loop, whose socket
transports are themselves a cycle (`transport._read_ready` is a bound method of the
transport; uvloop's are C objects), so those transports and what only they reach are set
aside; anything else found is a cycle the request made.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import types
from collections.abc import Awaitable, Callable

import pytest

from ..conftest import Service, chat_body

REQUESTS = 10


async def completed_stream(service: Service) -> None:
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    assert (await response.read()).endswith(b"data: [DONE]\n\n")


async def json_completion(service: Service) -> None:
    response = await service.chat(chat_body(stream=False))
    assert response.status == 200
    await response.read()


async def hung_up_stream(service: Service) -> None:
    response = await service.chat(chat_body(stream=True))
    assert response.status == 200
    assert await response.content.readany()
    response.close()
    # The service notices the hang-up and ends its handler (its log line follows).
    await asyncio.sleep(0.05)


async def rejected_request(service: Service) -> None:
    response = await service.chat(chat_body(stream=True), headers={**service.headers(), "authorization": "Bearer not-a-token"})
    assert response.status == 401
    await response.read()


def _describe(obj: object) -> str:
    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_filename}:{obj.f_code.co_name}"
    if isinstance(obj, (types.CoroutineType, types.GeneratorType)):
        code = getattr(obj, "cr_code", None) or getattr(obj, "gi_code", None)
        return f"coroutine {code.co_qualname}" if code is not None else type(obj).__name__
    if isinstance(obj, types.MethodType):
        return f"bound method {type(obj.__self__).__qualname__}.{obj.__func__.__name__}"
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _selector_transport_closure(garbage: list[object]) -> set[int]:
    """Ids of asyncio's selector transports in `garbage` and of everything they reach in it."""
    in_garbage = {id(obj): obj for obj in garbage}
    pending = [obj for obj in garbage if type(obj).__module__ == "asyncio.selector_events"]
    reached: set[int] = set()
    while pending:
        obj = pending.pop()
        if id(obj) in reached:
            continue
        reached.add(id(obj))
        pending.extend(ref for ref in gc.get_referents(obj) if id(ref) in in_garbage)
    return reached


async def cyclic_garbage(service: Service, request: Callable[[Service], Awaitable[None]]) -> list[object]:
    for _ in range(3):  # caches, pools and lazily built state exist before counting
        await request(service)
    await asyncio.sleep(0.05)
    gc.collect()
    gc.garbage.clear()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(REQUESTS):
            await request(service)
        await asyncio.sleep(0.05)
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    transports = _selector_transport_closure(garbage)
    return [obj for obj in garbage if id(obj) not in transports]


@pytest.mark.parametrize(
    "request_kind", [completed_stream, json_completion, hung_up_stream, rejected_request], ids=lambda kind: kind.__name__
)
async def test_a_request_leaves_no_cyclic_garbage(service: Service, request_kind: Callable[[Service], Awaitable[None]]) -> None:
    service.litellm.interval = 0.005
    left = await cyclic_garbage(service, request_kind)
    kinds = collections.Counter(_describe(obj) for obj in left)
    assert not left, f"{len(left)} objects in reference cycles after {REQUESTS} requests: {kinds.most_common(12)}"


async def test_the_check_sees_a_cycle_a_request_makes(service: Service) -> None:
    """The measurement itself: a cycle made per request is found."""

    async def request_with_cycle(service: Service) -> None:
        await completed_stream(service)
        holder: dict[str, object] = {}
        holder["self"] = holder  # one cycle per request

    left = await cyclic_garbage(service, request_with_cycle)
    assert len(left) == REQUESTS
