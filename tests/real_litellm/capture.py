"""Regenerate the captures of the real LiteLLM's wire (`tests/data/litellm-1.106.12`):

    python -m tests.real_litellm.capture --out tests/data/litellm-1.106.12

Starts the pinned LiteLLM proxy (`litellm_process.py`) on loopback with no database, its
model groups pointing at `tests/support/fake_provider.py`, sends each case's request and
records the answer as received. `<name>.http`: `#` lines (request line, request body,
seconds elapsed), then the status line, the headers in their order and spelling, a blank
line and the body (a chunked body de-chunked). For an event stream also `<name>.sse`, the
body's bytes, and `<name>.reads.json`, the sizes of the reads in which they arrived and
when (seconds after the request was sent).

LiteLLM runs with its defaults except where they only make it wait: its router retries a
429 after the provider's `Retry-After` (7 s, three times: 21 s per case) and a provider
timeout three times (9 s), so its retry policy has no retries for those two errors; and
its backoff between other retries is near zero (`FAST_RETRY_ENV`). Neither changes a byte
of an answer: those errors' messages do not mention retries, and the retries stay on where
one does (`err_messages_not_list`: "LiteLLM Retried: 2 times"). About 30 s in all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from tests.support.fake_provider import Behaviour, FakeProvider, serve_fake_provider
from tests.support.processes import free_port, stop_process

from .litellm_process import LITELLM_VERSION, MODEL_GROUPS, NOT_INSTALLED, REPO_ROOT, launch_litellm, litellm_executable

DEFAULT_OUT = REPO_ROOT / "tests" / "data" / f"litellm-{LITELLM_VERSION}"
MASTER_KEY = "sk-capture-master"  # LiteLLM without a database knows only its master key
WRONG_KEY = "sk-not-the-master-key"
USER = "uid123:ai"
START_TIMEOUT = 120.0
SLOW_MODEL_TIMEOUT = 3.0  # the slow model's deployment timeout: its 408 names it
PRICE_PER_TOKEN = 1.0
GLOBAL_MAX_BUDGET = 0.01  # below one priced call: without a database LiteLLM does not enforce it

PROVIDER_MODELS: dict[str, Behaviour] = {**MODEL_GROUPS, "rpm-model": Behaviour.OK}  # rpm 1 on its deployment


def litellm_config(provider_url: str) -> dict[str, Any]:
    deployments: list[dict[str, Any]] = []
    for group, behaviour in PROVIDER_MODELS.items():
        params: dict[str, Any] = {
            "model": f"openai/{behaviour.value}",
            "api_base": f"{provider_url}/v1",
            "api_key": "fake-provider-key",
        }
        deployment: dict[str, Any] = {"model_name": group, "litellm_params": params}
        if group == "slow-model":
            params["timeout"] = SLOW_MODEL_TIMEOUT
        if group == "rpm-model":
            params["rpm"] = 1
        if group == "priced-model":
            deployment["model_info"] = {"input_cost_per_token": PRICE_PER_TOKEN, "output_cost_per_token": PRICE_PER_TOKEN}
        deployments.append(deployment)
    deployments.append({"model_name": "mock-model", "litellm_params": {"model": "openai/mock", "mock_response": "Mocked hello"}})
    return {
        "model_list": deployments,
        "litellm_settings": {"max_budget": GLOBAL_MAX_BUDGET},
        "router_settings": {"retry_policy": {"RateLimitErrorRetries": 0, "TimeoutErrorRetries": 0}},
        "general_settings": {"master_key": MASTER_KEY},
    }


# Near-zero backoff between the router's retries (read by LiteLLM from its environment).
FAST_RETRY_ENV = {"INITIAL_RETRY_DELAY": "0.01", "MAX_RETRY_DELAY": "0.05", "JITTER": "0"}


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: str | None  # sent as is; None: a GET
    key: str | None = MASTER_KEY
    # LiteLLM counts a deployment's requests per UTC minute: the cases showing that count
    # start early enough in a minute to all fall within it.
    starts_minute_count: bool = False


def chat(model: str, **fields: Any) -> str:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}, separators=(",", ":")
    )


STREAM = {"stream": True, "stream_options": {"include_usage": True}}
CHAT = "/v1/chat/completions"


def provider_error_cases(kind: str, model: str) -> list[Case]:
    return [
        Case(f"err_{kind}_nonstream", CHAT, chat(model, user=USER, max_tokens=8192)),
        Case(f"err_{kind}_stream", CHAT, chat(model, user=USER, max_tokens=8192, **STREAM)),
    ]


# In the order they were first captured: a deployment's first call is slower (LiteLLM
# builds its client), and a stream cut within LiteLLM's first read answers differently.
CASES: list[Case] = [
    Case("model_hub_info", "/public/model_hub/info", None),
    Case("liveliness", "/health/liveliness", None),
    Case("readiness", "/health/readiness", None),
    Case("nonstream_ok", CHAT, chat("ok-model", user=USER, max_tokens=8192, temperature=0.1, top_p=0.01, stream=False)),
    Case("stream_ok", CHAT, chat("ok-model", user=USER, max_tokens=8192, **STREAM)),
    Case("stream_ok_no_usage", CHAT, chat("ok-model", user=USER, stream=True)),
    Case("mock_nonstream", CHAT, chat("mock-model", user=USER)),
    Case("mock_stream", CHAT, chat("mock-model", user=USER, **STREAM)),
    *provider_error_cases("ratelimit", "ratelimit-model"),
    *provider_error_cases("throttle", "throttle-model"),
    *provider_error_cases("ctx", "ctx-model"),
    *provider_error_cases("badparam", "badparam-model"),
    *provider_error_cases("e500", "e500-model"),
    *provider_error_cases("slow", "slow-model"),
    *provider_error_cases("midstream", "midstream-model"),
    Case("err_unknown_model_nonstream", CHAT, chat("no-such-model", user=USER)),
    Case("err_unknown_model_stream", CHAT, chat("no-such-model", user=USER, **STREAM)),
    Case("err_malformed_json", CHAT, '{"model":"ok-model","messages":['),
    Case("err_messages_not_list", CHAT, json.dumps({"model": "ok-model", "messages": "hi", "user": USER}, separators=(",", ":"))),
    Case("err_missing_messages", CHAT, json.dumps({"model": "ok-model", "user": USER}, separators=(",", ":"))),
    Case("err_bad_role", CHAT, json.dumps({"model": "ok-model", "messages": [{"role": "wizard", "content": "hi"}], "user": USER}, separators=(",", ":"))),
    Case("err_temperature_string", CHAT, chat("ok-model", temperature="hot", user=USER)),
    Case("err_bad_key", CHAT, chat("ok-model"), key=WRONG_KEY),
    Case("err_no_key", CHAT, chat("ok-model"), key=None),
    Case("customer_new_nodb", "/customer/new", json.dumps({"user_id": USER, "budget_id": "end-user-budget-ai"}, separators=(",", ":"))),
    Case("customer_info_nodb", f"/customer/info?end_user_id={USER}", None),
    # No search tool of that name configured (with one, search works without a database).
    Case("search_unknown_tool", "/v1/search/exa-search", json.dumps({"query": "hello", "max_results": 3, "user": USER}, separators=(",", ":"))),
    # rpm 1 on the deployment, three calls in a row: not enforced with the default routing.
    Case("err_router_rpm_1", CHAT, chat("rpm-model", user=USER), starts_minute_count=True),
    Case("err_router_rpm_2", CHAT, chat("rpm-model", user=USER)),
    Case("err_router_rpm_3", CHAT, chat("rpm-model", user=USER)),
    Case("global_budget_1", CHAT, chat("priced-model", user=USER)),
    Case("global_budget_2", CHAT, chat("priced-model", user=USER)),
    Case("global_budget_stream", CHAT, chat("priced-model", user=USER, **STREAM)),
]


@dataclass
class Answer:
    case: Case
    elapsed: float
    status_line: str
    raw_headers: list[tuple[str, str]]
    body: bytes
    reads: list[tuple[float, int]]

    @property
    def is_event_stream(self) -> bool:
        return any(
            name.lower() == "content-type" and value.startswith("text/event-stream") for name, value in self.raw_headers
        )


async def ask(session: aiohttp.ClientSession, base_url: str, case: Case) -> Answer:
    headers = {} if case.key is None else {"Authorization": f"Bearer {case.key}"}
    if case.body is not None:
        headers["Content-Type"] = "application/json"
    url = URL(base_url + case.path, encoded=True)  # the query as written (`:` unescaped)
    method = "GET" if case.body is None else "POST"
    data = None if case.body is None else case.body.encode()
    started = time.monotonic()
    reads: list[tuple[float, int]] = []
    body = b""
    async with session.request(method, url, data=data, headers=headers) as response:
        async for chunk in response.content.iter_any():
            reads.append((time.monotonic() - started, len(chunk)))
            body += chunk
        version = response.version
        status_line = f"HTTP/{version.major}.{version.minor} {response.status} {response.reason}"
        raw_headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in response.raw_headers]
    return Answer(case, time.monotonic() - started, status_line, raw_headers, body, reads)


def write(answer: Answer, out: Path) -> None:
    case = answer.case
    method = "GET" if case.body is None else "POST"
    head = [
        f"# request: {method} {case.path}",
        f"# request body: {case.body or ''}",
        f"# elapsed_s: {round(answer.elapsed, 3)}",
        answer.status_line,
        *(f"{name}: {value}" for name, value in answer.raw_headers),
    ]
    (out / f"{case.name}.http").write_bytes("\n".join(head).encode("latin-1") + b"\n\n" + answer.body)
    if answer.is_event_stream:
        (out / f"{case.name}.sse").write_bytes(answer.body)
        reads = [{"t": round(t, 3), "n": n} for t, n in answer.reads]
        (out / f"{case.name}.reads.json").write_text(json.dumps(reads))


async def wait_until_up(session: aiohttp.ClientSession, base_url: str, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            async with session.get(f"{base_url}/health/liveliness") as response:
                if response.status == 200:
                    return True
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    return False


async def early_in_a_minute(needed: float = 10.0) -> None:
    """Wait for the next UTC minute if less than `needed` seconds of this one are left."""
    left = 60.0 - time.time() % 60.0
    if left < needed:
        await asyncio.sleep(left + 0.1)


class CaptureFailed(RuntimeError):
    pass


async def capture(out: Path, cases: Iterable[Case] = CASES) -> list[Answer]:
    """Run LiteLLM against the fake provider and write each case's answer into `out`."""
    executable = litellm_executable()
    if executable is None:
        raise CaptureFailed(NOT_INSTALLED)
    out.mkdir(parents=True, exist_ok=True)
    provider = FakeProvider(slow_seconds=SLOW_MODEL_TIMEOUT + 2.0, cut_after=0.1)
    runner = await serve_fake_provider(provider)
    provider_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    answers: list[Answer] = []
    with tempfile.TemporaryDirectory(prefix="litellm-capture-") as workdir:
        server = launch_litellm(executable, litellm_config(provider_url), Path(workdir), free_port(), **FAST_RETRY_ENV)
        try:
            async with aiohttp.ClientSession(auto_decompress=False) as session:
                if not await wait_until_up(session, server.base_url, server.process, START_TIMEOUT):
                    raise CaptureFailed(f"LiteLLM did not start: {server.log_tail(5)}")
                async with session.get(f"{server.base_url}/public/model_hub/info") as response:
                    version = (await response.json())["litellm_version"]
                if version != LITELLM_VERSION:
                    raise CaptureFailed(f"{executable} is LiteLLM {version}, the captures are of {LITELLM_VERSION}")
                for case in cases:
                    if case.starts_minute_count:
                        await early_in_a_minute()
                    answer = await ask(session, server.base_url, case)
                    write(answer, out)
                    answers.append(answer)
        finally:
            await asyncio.to_thread(stop_process, server.process)
            await runner.cleanup()
    return answers


def capture_files(folder: Path) -> list[Path]:
    return sorted([*folder.glob("*.http"), *folder.glob("*.sse"), *folder.glob("*.reads.json")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder to write into (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="litellm-captures-") as fresh:
        try:
            answers = asyncio.run(capture(Path(fresh)))
        except CaptureFailed as failure:
            print(failure, file=sys.stderr)
            return 1
        # Replaced only once all succeeded; a case no longer captured leaves no file behind.
        args.out.mkdir(parents=True, exist_ok=True)
        for stale in capture_files(args.out):
            stale.unlink()
        for path in capture_files(Path(fresh)):
            shutil.copyfile(path, args.out / path.name)
    for answer in answers:
        print(f"{answer.case.name:30} {answer.status_line[9:]:28} {answer.elapsed:6.2f} s")
    print(f"{len(answers)} captures written to {args.out} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
