"""What clients get during a LiteLLM outage, under each readiness rule (compatibility.md D64).

    PYTHONPATH=. python -m tests.bench.readiness_outage                 # a 30 s outage, time / 10
    PYTHONPATH=. python -m tests.bench.readiness_outage --outage 60 --scale 0.2

One service (real HTTP, the in-memory store) before a fake LiteLLM that is stopped for
`--outage` seconds and started again. A kubelet is emulated with the shipped readiness probe
(period 10 s, failure threshold 3, success threshold 1; config/kubernetes/base/deployment.yaml)
and decides whether the pod is in the Service's endpoints. A client sends one non-streaming
completion every 100 ms: to the pod while it is an endpoint, else it counts the load
balancer's own error page (every pod shares the outage, so none is left). Time runs `--scale`
times faster; the printed times are scaled back. Each rule is run once, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from mlpa_aiohttp.app import create_app
from mlpa_aiohttp.observability.logging import configure_logging
from mlpa_aiohttp.settings import Settings
from mlpa_aiohttp.testing.fake_fxa import FakeFxA
from mlpa_aiohttp.testing.fake_litellm import FakeLiteLLM
from tests.support.processes import free_port

PROBE_PERIOD_S, FAILURE_THRESHOLD, SUCCESS_THRESHOLD = 10.0, 3, 1
CLIENT_INTERVAL_S = 0.1  # real time: the client is not scaled
KEYS = {"MASTER_KEY": "sk-bench-master", "MLPA_VIRTUAL_KEY": "sk-bench-virtual", "MLPA_UI_ACCESS_KEY": "sk-bench-ui",
        "MLPA_ACCESS_TOKEN_SECRET": "bench-access-token-secret-of-32-bytes-or-more",
        "MLPA_EXPERIMENTATION_AUTHORIZATION_TOKEN": ""}


class Site:
    def __init__(self, app: web.Application, port: int) -> None:
        self.app, self.port, self.runner = app, port, web.AppRunner(app)

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app) if self.runner is None else self.runner
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        await self.runner.cleanup()
        self.runner = None  # type: ignore[assignment]


@dataclass
class Timeline:
    in_endpoints: bool = True
    answers: Counter[str] = field(default_factory=Counter)
    lb_page_after_recovery_s: float = 0.0
    out_of_endpoints_s: float = 0.0


async def run(rule_env: dict[str, str], outage_s: float, scale: float) -> Timeline:
    litellm_fake = FakeLiteLLM(virtual_key=KEYS["MLPA_VIRTUAL_KEY"], master_key=KEYS["MASTER_KEY"])
    litellm = Site(litellm_fake.make_app(), free_port())
    fxa = FakeFxA()
    fxa_site = Site(fxa.make_app(), free_port())
    await litellm.start()
    await fxa_site.start()
    settings = Settings.from_environ({
        **KEYS, "MLPA_STORE": "memory", "APP_ATTEST_ENABLED": "false", "PLAY_INTEGRITY_ENABLED": "false",
        "LITELLM_API_BASE": f"http://127.0.0.1:{litellm.port}", "FXA_BASE_URL": f"http://127.0.0.1:{fxa_site.port}/v1",
        "READINESS_CHECK_TIMEOUT_S": str(2.0 * scale), **rule_env,
    })
    service = Site(create_app(settings), free_port())
    await service.start()
    base = f"http://127.0.0.1:{service.port}"
    headers = {"authorization": f"Bearer {fxa.issue_jwt('bench-uid')}", "service-type": "ai"}
    body = json.dumps({"model": "gpt-oss-120b", "messages": [{"role": "user", "content": "Hello"}]})
    timeline = Timeline()
    recovered_at: list[float] = []
    started = time.monotonic()
    period = PROBE_PERIOD_S * scale
    end = started + (outage_s + 6 * PROBE_PERIOD_S) * scale

    async with aiohttp.ClientSession() as session:
        async def kubelet() -> None:
            failures = successes = 0
            while time.monotonic() < end:
                async with session.get(base + "/health/readiness") as probe:
                    ok = probe.status == 200
                failures, successes = (0, successes + 1) if ok else (failures + 1, 0)
                if timeline.in_endpoints and failures >= FAILURE_THRESHOLD:
                    timeline.in_endpoints = False
                elif not timeline.in_endpoints and successes >= SUCCESS_THRESHOLD:
                    timeline.in_endpoints = True
                await asyncio.sleep(period)

        async def client() -> None:
            while time.monotonic() < end:
                now = time.monotonic()
                if not timeline.in_endpoints:
                    timeline.answers["load balancer's error page"] += 1
                    timeline.out_of_endpoints_s += CLIENT_INTERVAL_S / scale
                    if recovered_at:
                        timeline.lb_page_after_recovery_s += CLIENT_INTERVAL_S / scale
                else:
                    async with session.post(base + "/v1/chat/completions", data=body, headers=headers) as reply:
                        text = await reply.text()
                        timeline.answers["200, an answer" if reply.status == 200 else f"{reply.status} {text}"] += 1
                await asyncio.sleep(max(0.0, CLIENT_INTERVAL_S - (time.monotonic() - now)))

        async def outage() -> None:
            await asyncio.sleep(1.5 * PROBE_PERIOD_S * scale)
            await litellm.stop()
            await asyncio.sleep(outage_s * scale)
            await litellm.start()
            recovered_at.append(time.monotonic())

        await asyncio.gather(kubelet(), client(), outage())
    for site in (service, litellm, fxa_site):
        await site.stop()
    return timeline


def main() -> None:
    configure_logging(level="CRITICAL", json=True)  # the outage's own ERROR lines are not the output
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outage", type=float, default=30.0, help="LiteLLM outage, seconds (default 30)")
    parser.add_argument("--scale", type=float, default=0.1, help="time runs this many times faster (default 0.1)")
    args = parser.parse_args()
    rules: dict[str, dict[str, Any]] = {
        "own health (default)": {},
        "READINESS_REQUIRES_DEPENDENCIES=true (reference)": {"READINESS_REQUIRES_DEPENDENCIES": "true"},
    }
    print(f"LiteLLM down {args.outage:g} s; probe every {PROBE_PERIOD_S:g} s, {FAILURE_THRESHOLD} failures take the"
          f" pod out, {SUCCESS_THRESHOLD} success brings it back; one request per {CLIENT_INTERVAL_S / args.scale:g} s")
    for name, env in rules.items():
        timeline = asyncio.run(run(env, args.outage, args.scale))
        print(f"\n{name}: out of the Service {timeline.out_of_endpoints_s:.0f} s, of which"
              f" {timeline.lb_page_after_recovery_s:.0f} s after LiteLLM was back")
        for answer, count in timeline.answers.most_common():
            print(f"  {count:5d}  {answer}")


if __name__ == "__main__":
    main()
