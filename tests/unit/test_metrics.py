"""Metrics of compatibility.md §6 recorded at the right points, over real requests; bounded labels;
compatibility.md D9 (unmatched paths, whole-stream latency) and compatibility.md D19 (several processes)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlpa_aiohttp import keys

from tests.support.metrics import sample, samples
from tests.support.store_seeding import seed_user
from tests.support.waiting import wait_for

from ..conftest import Service, ServiceFactory, chat_body

CHAT = {"model": "gpt-oss-120b", "service_type": "ai", "purpose": ""}
FIREFOX_UA = "Mozilla/5.0 (X11; Linux x86_64; rv:155.0) Gecko/20100101 Firefox/155.0"


def availability(service: Service) -> list[tuple[dict[str, str], float]]:
    return samples(service, "mlpa_chat_availability_total")


# -- request instrumentation ------------------------------------------------------------------


async def test_request_counters_latency_and_status(service: Service) -> None:
    headers = {"user-agent": FIREFOX_UA, "service-type": "ai", "purpose": " chat "}
    response = await service.client.get("/health/liveness", headers=headers)
    assert response.status == 200
    labels = {
        "method": "GET", "endpoint": "/health/liveness", "service_type": "ai", "purpose": "chat", "major_fx_version": "155",
        # Not a proxy route, and contracts are off by default (compatibility.md §6).
        "traffic_contract_rpm_mode": "N/A", "traffic_contract_tpm_mode": "N/A",
    }  # fmt: skip
    assert sample(service, "mlpa_requests_total", labels) == 1
    assert sample(service, "mlpa_response_status_codes_total", {"status_code": "200"}) == 1
    assert sample(service, "mlpa_request_latency_seconds_count", {"method": "GET", "endpoint": "/health/liveness"}) == 1
    assert sample(service, "mlpa_in_progress_requests") == 0


@pytest.mark.parametrize(
    "headers, expected",
    [
        ({"service-type": "weird", "purpose": "nonsense"}, {"service_type": "other", "purpose": "other"}),
        ({}, {"service_type": "", "purpose": ""}),
        ({"service-type": "search-dev", "purpose": "memory-generation"}, {"service_type": "search-dev", "purpose": "memory-generation"}),
    ],
)
async def test_service_type_and_purpose_labels_are_clamped(service: Service, headers: dict, expected: dict) -> None:
    await service.client.get("/health/liveness", headers={"user-agent": "curl/8", **headers})
    (labels, count), = samples(service, "mlpa_requests_total")
    assert count == 1
    assert {k: labels[k] for k in ("service_type", "purpose")} == expected


@pytest.mark.parametrize(
    "user_agent, expected",
    [
        (FIREFOX_UA, "155"),
        ("Mozilla/5.0 Firefox/100.0", "100"),
        ("Mozilla/5.0 Firefox/199.1", "199"),
        ("Mozilla/5.0 Firefox/99.0", "unknown"),
        ("Mozilla/5.0 Firefox/200.0", "unknown"),
        ("Mozilla/5.0 Firefox/1550.0", "unknown"),
        ("Mozilla/5.0 Chrome/120.0", ""),
        ("Mozilla/5.0 Firefox/155", ""),
    ],
)
async def test_firefox_major_version_label(service: Service, user_agent: str, expected: str) -> None:
    await service.client.get("/health/liveness", headers={"user-agent": user_agent})
    (labels, _), = samples(service, "mlpa_requests_total")
    assert labels["major_fx_version"] == expected


async def test_unmatched_paths_share_one_label(service: Service) -> None:
    for path in ("/wp-admin", "/.env", "/a/b/c?x=1"):
        assert (await service.client.get(path)).status == 404
    (labels, count), = samples(service, "mlpa_requests_total")
    assert (labels["endpoint"], count) == ("unmatched", 3)
    assert sample(service, "mlpa_request_latency_seconds_count", {"method": "GET", "endpoint": "unmatched"}) == 3
    assert sample(service, "mlpa_response_status_codes_total", {"status_code": "404"}) == 3


async def test_route_templates_are_the_endpoint_label(make_service: ServiceFactory) -> None:
    service = await make_service(MLPA_MOCK_ROUTES="true", MOCK_TTFT_MS="0")
    await service.client.post("/mock/chat/completions", data=json.dumps(chat_body()), headers=service.headers())
    endpoints = {labels["endpoint"] for labels, _ in samples(service, "mlpa_requests_total")}
    assert endpoints == {"/mock/chat/completions"}


async def test_unknown_methods_are_invalid(service: Service) -> None:
    response = await service.client.request("TRACE", "/health/liveness")
    assert response.status == 405
    (labels, _), = samples(service, "mlpa_requests_total")
    assert labels["method"] == "INVALID"
    assert sample(service, "mlpa_request_latency_seconds_count", {"method": "INVALID", "endpoint": labels["endpoint"]}) == 1


async def test_stream_latency_and_in_progress_cover_the_whole_stream(service: Service) -> None:
    service.litellm.interval = 0.1
    service.litellm.chunks = 5
    response = await service.chat(chat_body(stream=True))
    assert b"data: " in await response.content.readany()
    # Headers and the first chunk are out; the stream is still being relayed.
    assert sample(service, "mlpa_in_progress_requests") == 1
    assert sample(service, "mlpa_request_latency_seconds_count", {"method": "POST", "endpoint": "/v1/chat/completions"}) == 0
    await response.read()
    await wait_for(lambda: sample(service, "mlpa_in_progress_requests") == 0)
    latency = sample(service, "mlpa_request_latency_seconds_sum", {"method": "POST", "endpoint": "/v1/chat/completions"})
    # At least the fake's own pauses between its chunks (a lower bound: cannot flake).
    assert latency >= (service.litellm.chunks - 1) * service.litellm.interval, f"request latency {latency:.3f}s does not cover the stream"


# -- availability: exactly one sample per chat request that reaches a recording site -----------

# scenario (fake LiteLLM), stream, expected (outcome, reason), latency result, rejection reason
UPSTREAM_CASES = [
    (None, False, ("success", "valid_response"), "success", None),
    (None, True, ("success", "valid_response"), "success", None),
    ("budget_429", False, ("excluded", "budget_exceeded"), "error", "budget_exceeded"),
    ("budget_400", True, ("excluded", "budget_exceeded"), "error", "budget_exceeded"),
    ("rate_limit_429", False, ("excluded", "rate_limited_platform"), "error", "rate_limited"),
    ("throttling_429", True, ("excluded", "rate_limited_upstream"), "error", "rate_limited"),
    ("context_window_400", False, ("excluded", "payload_too_large"), "error", "payload_too_large"),
    ("invalid_argument_400", False, ("excluded", "invalid_request"), "error", "invalid_request"),
    ("unclassified_400", False, ("failure", "upstream_error"), "error", None),
    ("server_500", True, ("failure", "upstream_error"), "error", None),
    ("mid_stream_error", True, ("failure", "upstream_error"), "error", None),
    ("empty_stream", True, ("failure", "empty_response"), "error", None),
]


@pytest.mark.parametrize("scenario, stream, expected, result, rejection", UPSTREAM_CASES)
async def test_upstream_outcomes(
    service: Service, scenario: str | None, stream: bool, expected: tuple, result: str, rejection: str | None
) -> None:
    response = await service.chat(chat_body(stream=stream, scenario=scenario))
    await response.read()
    outcome, reason = expected
    assert availability(service) == [({"outcome": outcome, "reason": reason, **CHAT}, 1.0)]
    # Latency says error where availability says excluded (policy rejections).
    assert samples(service, "mlpa_chat_completion_latency_seconds_count") == [({"result": result, **CHAT}, 1.0)]
    rejections = samples(service, "mlpa_chat_request_rejections_total")
    assert rejections == ([({"reason": rejection, **CHAT}, 1.0)] if rejection else [])


async def test_client_disconnect_is_one_abort_sample(service: Service) -> None:
    service.litellm.interval = 0.2
    service.litellm.chunks = 50
    response = await service.chat(chat_body(stream=True))
    assert b"data: " in await response.content.readany()
    response.close()
    await wait_for(lambda: availability(service))
    await asyncio.sleep(0.05)
    assert availability(service) == [({"outcome": "abort", "reason": "client_disconnect", **CHAT}, 1.0)]
    assert samples(service, "mlpa_chat_completion_latency_seconds_count") == [({"result": "abort", **CHAT}, 1.0)]


# request override, expected (outcome, reason, model label)
PRE_COMPLETION_CASES = [
    ({"authorization": "Bearer not-a-token"}, ("excluded", "auth_rejected", "gpt-oss-120b")),
    ({"authorization": ""}, ("excluded", "auth_rejected", "gpt-oss-120b")),
    ({"purpose": "nonsense"}, ("excluded", "invalid_auth_request", "gpt-oss-120b")),
    ({"model": "Not A Model"}, ("excluded", "invalid_model_name", "invalid")),
    ({"model": "exa"}, ("excluded", "invalid_service_type_for_model", "exa")),
]


@pytest.mark.parametrize("override, expected", PRE_COMPLETION_CASES)
async def test_pre_completion_rejections(service: Service, override: dict, expected: tuple) -> None:
    model = override.pop("model", "gpt-oss-120b")
    response = await service.chat(chat_body(model=model), headers=service.headers(**override))
    assert response.status in (400, 401)
    outcome, reason, model_label = expected
    purpose = "other" if override.get("purpose") else ""
    assert availability(service) == [
        ({"outcome": outcome, "reason": reason, "model": model_label, "service_type": "ai", "purpose": purpose}, 1.0)
    ]
    assert samples(service, "mlpa_chat_completion_latency_seconds_count") == []
    assert not service.litellm.requests_to("/v1/chat/completions")


async def test_blocked_user(service: Service) -> None:
    await seed_user(service.app[keys.STORE], "test-uid:ai", "end-user-budget-ai", blocked=True)
    response = await service.chat()
    assert response.status == 403
    assert availability(service) == [({"outcome": "excluded", "reason": "blocked", **CHAT}, 1.0)]


async def test_signup_cap(make_service: ServiceFactory) -> None:
    service = await make_service(MLPA_ENFORCE_SIGNIN_CAP="true", MLPA_MAX_SIGNED_IN_USERS="0")
    response = await service.chat()
    assert response.status == 403
    assert availability(service) == [({"outcome": "excluded", "reason": "signup_cap_exceeded", **CHAT}, 1.0)]
    assert samples(service, "mlpa_chat_request_rejections_total") == [({"reason": "signup_cap_exceeded", **CHAT}, 1.0)]


async def test_oversized_chat_request(make_service: ServiceFactory) -> None:
    service = await make_service(MAX_REQUEST_SIZE_BYTES="1024")
    response = await service.chat(chat_body(padding="x" * 2048), headers=service.headers(purpose="chat"))
    assert response.status == 413
    assert availability(service) == [
        ({"outcome": "excluded", "reason": "payload_too_large", "model": "invalid", "service_type": "ai", "purpose": "chat"}, 1.0)
    ]
    # The 413 passes through the request instrumentation (compatibility.md D7).
    assert sample(service, "mlpa_response_status_codes_total", {"status_code": "413"}) == 1


async def test_validation_errors_are_not_availability_samples(service: Service) -> None:
    headers = service.headers()
    del headers["service-type"]
    response = await service.chat(headers=headers)
    assert response.status == 422
    assert availability(service) == []


# -- label clamping on failure-side metrics ------------------------------------------------------


async def test_unknown_model_is_invalid_on_failures_and_raw_on_success(service: Service) -> None:
    model = "my-private-model"
    ok = await service.chat(chat_body(model=model))
    assert ok.status == 200
    failed = await service.chat(chat_body(model=model, scenario="budget_429"))
    assert failed.status == 429
    labels = {"service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_chat_completion_latency_seconds_count", {"result": "success", "model": model, **labels}) == 1
    assert sample(service, "mlpa_chat_completion_latency_seconds_count", {"result": "error", "model": "invalid", **labels}) == 1
    assert sample(service, "mlpa_chat_request_rejections_total", {"reason": "budget_exceeded", "model": "invalid", **labels}) == 1
    assert {l["model"] for l, _ in availability(service)} == {"invalid"}
    assert {l["model"] for l, _ in samples(service, "mlpa_requests_by_country_total")} == {"invalid"}


@pytest.mark.parametrize("country, expected", [("FR", "FR"), ("fr", "unknown"), ("XX", "unknown"), (None, "unknown")])
async def test_country_label(service: Service, country: str | None, expected: str) -> None:
    extra = {"X-Geo-Country": country} if country else {}
    response = await service.chat(headers={**service.headers(), **extra})
    assert response.status == 200
    assert samples(service, "mlpa_requests_by_country_total") == [
        ({"service_type": "ai", "model": "gpt-oss-120b", "client_country": expected}, 1.0)
    ]


async def test_country_is_recorded_only_after_auth(service: Service) -> None:
    await service.chat(headers=service.headers(authorization="Bearer nope", X_Geo_Country="FR"))
    assert samples(service, "mlpa_requests_by_country_total") == []


async def test_search_country_uses_the_search_model(service: Service) -> None:
    response = await service.client.post(
        "/v1/search",
        data=json.dumps({"query": "q", "max_results": 3}),
        headers={**service.headers(service_type="search"), "X-Geo-Country": "DE"},
    )
    assert response.status == 200
    assert samples(service, "mlpa_requests_by_country_total") == [
        ({"service_type": "search", "model": "exa-search", "client_country": "DE"}, 1.0)
    ]
    assert sample(service, "mlpa_search_latency_seconds_count", {"result": "success"}) == 1
    assert availability(service) == []


async def test_search_rejection(service: Service) -> None:
    response = await service.client.post(
        "/v1/search",
        data=json.dumps({"query": "q [fake:budget_429]", "max_results": 3}),
        headers=service.headers(service_type="search"),
    )
    assert response.status == 429
    assert samples(service, "mlpa_search_request_rejections_total") == [
        ({"reason": "budget_exceeded", "model": "exa-search", "service_type": "search", "purpose": ""}, 1.0)
    ]
    assert sample(service, "mlpa_search_latency_seconds_count", {"result": "error"}) == 1


# -- success-side metrics -----------------------------------------------------------------------


async def test_success_side_metrics_of_a_stream(service: Service) -> None:
    response = await service.chat(chat_body(stream=True))
    await response.read()
    assert sample(service, "mlpa_chat_completion_ttft_seconds_count", {"model": "gpt-oss-120b"}) == 1
    assert sample(service, "mlpa_chat_tokens_total", {"type": "prompt", **CHAT}) == service.litellm.prompt_tokens
    assert sample(service, "mlpa_chat_tokens_per_request_count", {"type": "completion", **CHAT}) == 1
    routed = {"requested_model": "gpt-oss-120b", "backend": "https://api.fake-provider.test/v1", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_litellm_routed_completions_total", {**routed, "fallback_used": "false"}) == 1
    assert sample(service, "mlpa_litellm_attempted_fallbacks_count", routed) == 1
    assert sample(service, "mlpa_litellm_reported_duration_seconds_sum", {**routed, "fallback_used": "false"}) == pytest.approx(0.0125)
    assert sample(service, "mlpa_litellm_reported_cost_usd_total", {**routed, "fallback_used": "false"}) == pytest.approx(0.00012)


async def test_routing_headers_fallback_and_missing_backend(service: Service) -> None:
    service.litellm.response_headers = {"x-litellm-attempted-fallbacks": "2", "x-litellm-response-duration-ms": "-1"}
    response = await service.chat()
    assert response.status == 200
    routed = {"requested_model": "gpt-oss-120b", "backend": "unknown", "service_type": "ai", "purpose": ""}
    assert sample(service, "mlpa_litellm_routed_completions_total", {**routed, "fallback_used": "true"}) == 1
    assert samples(service, "mlpa_litellm_reported_duration_seconds_count") == []
    assert samples(service, "mlpa_litellm_reported_cost_usd_total") == []


async def test_fxa_metrics(service: Service) -> None:
    await service.chat()
    await service.chat()
    await service.chat(headers=service.headers(authorization="Bearer bad"))
    assert sample(service, "mlpa_validate_fxa_latency_seconds_count", {"result": "success", "verification_source": "local"}) == 1
    assert sample(service, "mlpa_validate_fxa_latency_seconds_count", {"result": "success", "verification_source": "cached"}) == 1
    assert sample(service, "mlpa_validate_fxa_latency_seconds_count", {"result": "error", "verification_source": "unknown"}) == 1
    assert sample(service, "mlpa_fxa_verifications_total", {"verification_source": "local"}) == 1


async def test_requests_with_tools(service: Service) -> None:
    await service.chat(chat_body(tools=[{"type": "function", "function": {"name": "f"}}]))
    await service.chat(chat_body(tools=[]))
    assert samples(service, "mlpa_chat_requests_with_tools_total") == [(CHAT, 1.0)]


# -- exposition ----------------------------------------------------------------------------------


async def test_metrics_exposition(service: Service) -> None:
    await service.chat()
    response = await service.client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"
    families = {family.name: family for family in text_string_to_metric_families(await response.text())}
    assert "mlpa_chat_availability" in families
    assert "mlpa_request_latency_seconds" in families
    # One sample counted; the others are the series every reason has from start, at zero.
    (sample,) = [s for s in families["mlpa_chat_availability"].samples if s.name == "mlpa_chat_availability_total" and s.value]
    assert sample.labels == {"outcome": "success", "reason": "valid_response", **CHAT}


_WRITER = textwrap.dedent(
    """
    import sys
    from prometheus_client import CollectorRegistry
    from mlpa_aiohttp.observability.metrics import Metrics

    metrics = Metrics(CollectorRegistry())
    metrics.requests.labels("POST", "/v1/chat/completions", "ai", "", "", "N/A", "N/A").inc(int(sys.argv[1]))
    metrics.request_latency.labels("POST", "/v1/chat/completions").observe(0.2)
    """
)


async def test_metrics_endpoint_sums_several_processes(make_service: ServiceFactory, tmp_path, monkeypatch) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": os.getcwd()}
    for count in (3, 4):
        subprocess.run([sys.executable, "-c", _WRITER, str(count)], env=env, check=True, timeout=30)
    assert len({path.name.rsplit("_", 1)[-1] for path in directory.glob("*.db")}) == 2, "one file set per process"

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    service = await make_service(PROMETHEUS_MULTIPROC_DIR=str(directory))
    response = await service.client.get("/metrics")
    families = {family.name: family for family in text_string_to_metric_families(await response.text())}
    requests = [s for s in families["mlpa_requests"].samples if s.name == "mlpa_requests_total"]
    assert [(s.labels["endpoint"], s.value) for s in requests] == [("/v1/chat/completions", 7.0)]
    latency_count = [s for s in families["mlpa_request_latency_seconds"].samples if s.name.endswith("_count")]
    assert [s.value for s in latency_count] == [2.0]


async def test_process_and_gc_series_as_prometheus_client_exposes_them(service: Service) -> None:
    """One process: the default collectors' names and labels, unchanged (dashboards built
    for the reference keep working)."""
    response = await service.client.get("/metrics")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(await response.text())
        for s in family.samples
    }
    names = {name for name, _ in samples}
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "process_start_time_seconds"):
        assert (name, ()) in samples, name
    assert samples[("process_resident_memory_bytes", ())] > 10 * 1024 * 1024
    for generation in ("0", "1", "2"):
        assert (("python_gc_collections_total", (("generation", generation),))) in samples
    assert {"python_gc_objects_collected_total", "python_gc_objects_uncollectable_total", "python_info"} <= names


async def test_collections_are_timed_by_generation_in_metrics(service: Service) -> None:
    async def scrape() -> dict[tuple[str, str], float]:
        response = await service.client.get("/metrics")
        assert response.status == 200
        found = {}
        for family in text_string_to_metric_families(await response.text()):
            if family.name == "mlpa_gc_pause_seconds":
                for sample in family.samples:
                    if sample.name.endswith(("_count", "_sum")):
                        found[(sample.name.rsplit("_", 1)[1], sample.labels["generation"])] = sample.value
        return found

    before = await scrape()
    gc.collect()  # one full collection, generation 2
    gc.collect(0)
    after = await scrape()
    assert after[("count", "2")] >= before[("count", "2")] + 1
    assert after[("count", "0")] >= before[("count", "0")] + 1
    assert after[("sum", "2")] > before[("sum", "2")]
    assert set(gen for _, gen in after) == {"0", "1", "2"}


async def test_signup_capacity_gauges_are_read_at_scrape_time(make_service: ServiceFactory) -> None:
    service = await make_service(MLPA_ENFORCE_SIGNIN_CAP="true", MLPA_MAX_SIGNED_IN_USERS="5")

    async def scraped() -> dict[str, float]:
        response = await service.client.get("/metrics")
        return {
            s.name: s.value
            for family in text_string_to_metric_families(await response.text())
            for s in family.samples
            if s.name.startswith(("mlpa_signup_capacity", "mlpa_signup_cap_"))
        }

    assert await scraped() == {
        "mlpa_signup_capacity_max_identities": 5.0,
        "mlpa_signup_capacity_current_identities": 0.0,
        "mlpa_signup_cap_enforced": 1.0,
    }
    assert (await service.chat()).status == 200  # a new user of a capped service type takes a slot
    assert (await scraped())["mlpa_signup_capacity_current_identities"] == 1.0


def test_labelled_children_are_remembered_without_changing_the_series() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from mlpa_aiohttp.observability.metrics import Metrics

    metrics = Metrics(CollectorRegistry())
    first = metrics.status_codes.labels("200")
    assert metrics.status_codes.labels("200") is first
    # A value given as a number names the same series as its text, as in prometheus-client.
    metrics.status_codes.labels(200).inc()
    first.inc()
    metrics.status_codes.labels(status_code="200").inc()
    text = generate_latest(metrics.registry).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    [series] = [s for s in families["mlpa_response_status_codes"].samples if s.name.endswith("_total")]
    assert (series.labels, series.value) == ({"status_code": "200"}, 3.0)
    # Removed children are forgotten: the next one starts from zero.
    metrics.status_codes.remove("200")
    assert metrics.status_codes.labels("200") is not first
    metrics.status_codes.clear()
    assert "mlpa_response_status_codes_total{" not in generate_latest(metrics.registry).decode()
