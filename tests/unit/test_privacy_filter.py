"""`POST /privacy-filter` and readiness's `privacy_filter` entry over real HTTP, against the
package's fake Privacy Filter on loopback (compatibility.md §1.11, §1.2)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from mlpa_aiohttp import keys
from mlpa_aiohttp.settings import Settings, SettingsError
from mlpa_aiohttp.testing.fake_privacy_filter import (
    FILTER_PATH,
    READYZ_PATH,
    FakePrivacyFilter,
)

from tests.support.metrics import sample

from ..conftest import TEST_SECRETS, Service, ServiceFactory, events

FILTER_KEY = "sk-test-privacy-filter"
EMAIL_ITEM = "email me at jane@example.com"
MASKED = {
    "results": [
        {
            "masked_text": "email me at [EMAIL]",
            "spans": [{"category": "email", "text": "jane@example.com", "start": 12, "end": 28, "score": 0.99}],
        }
    ],
    "model_id": "pii-filter",
    "num_items": 1,
}
DISABLED = {"detail": {"error": "Privacy Filter is disabled."}}
PROXY_FAILED = {"detail": {"error": "Failed to proxy request to Privacy Filter"}}


@pytest.fixture
async def fake_filter_server(aiohttp_server) -> AsyncIterator[tuple[FakePrivacyFilter, TestServer]]:
    fake = FakePrivacyFilter(api_key=FILTER_KEY)
    server = await aiohttp_server(fake.make_app())
    yield fake, server


@pytest.fixture
async def filter_service(make_service: ServiceFactory, fake_filter_server) -> AsyncIterator[tuple[Service, FakePrivacyFilter]]:
    """The service with the filter on, pointed at the fake."""
    fake, server = fake_filter_server
    service = await make_service(
        PRIVACY_FILTER_ENABLED="true",
        PRIVACY_FILTER_MASTER_KEY=FILTER_KEY,
        PRIVACY_FILTER_API_BASE=str(server.make_url("")).rstrip("/"),
    )
    yield service, fake


@pytest.fixture
async def reference_readiness(make_service: ServiceFactory, fake_filter_server) -> AsyncIterator[tuple[Service, FakePrivacyFilter]]:
    """The filter on, and readiness under the reference's rule (READINESS_REQUIRES_DEPENDENCIES,
    compatibility.md D64): a filter that is not ready makes the pod unready."""
    fake, server = fake_filter_server
    service = await make_service(
        PRIVACY_FILTER_ENABLED="true",
        PRIVACY_FILTER_MASTER_KEY=FILTER_KEY,
        PRIVACY_FILTER_API_BASE=str(server.make_url("")).rstrip("/"),
        READINESS_REQUIRES_DEPENDENCIES="true",
    )
    yield service, fake


async def post_filter(
    service: Service,
    body: Any,
    *,
    token: str | None = None,
    path: str = "/privacy-filter",
    headers: dict[str, str] | None = None,
    **kw: Any,
):
    sent = {"authorization": f"Bearer {service.token if token is None else token}", "content-type": "application/json"}
    return await service.client.post(path, data=json.dumps(body), headers={**sent, **(headers or {})}, **kw)


# -- disabled (the default) ---------------------------------------------------------------


async def test_disabled_is_503_before_authentication(service: Service) -> None:
    for token in (service.token, "not-a-valid-token"):
        response = await post_filter(service, {"items": [EMAIL_ITEM]}, token=token)
        assert response.status == 503
        assert await response.json() == DISABLED
    assert service.fxa.verify_count("not-a-valid-token") == 0


async def test_validation_comes_first_even_while_disabled(service: Service) -> None:
    response = await post_filter(service, {})
    assert response.status == 422
    assert await response.json() == {"detail": [{"loc": ["body", "items"], "msg": "Field required", "type": "missing"}]}
    response = await service.client.post("/privacy-filter", json={"items": ["a"]})
    assert response.status == 422
    assert (await response.json())["detail"][0]["loc"] == ["header", "authorization"]


@pytest.mark.parametrize("body", [{"items": "a string"}, {"items": [1, 2]}, {"items": None}, ["a"]])
async def test_items_must_be_a_list_of_strings(service: Service, body: Any) -> None:
    response = await post_filter(service, body)
    assert response.status == 422
    assert all(item["loc"][0] == "body" for item in (await response.json())["detail"])


# -- enabled: auth ---------------------------------------------------------------------------


async def test_bad_token_is_401_and_nothing_reaches_the_filter(filter_service) -> None:
    service, fake = filter_service
    response = await post_filter(service, {"items": [EMAIL_ITEM]}, token="not-a-valid-token")
    assert response.status == 401
    assert await response.json() == {"detail": "Invalid FxA auth"}
    assert fake.requests_to(FILTER_PATH) == []


async def test_empty_authorization_is_401_missing(filter_service) -> None:
    service, fake = filter_service
    response = await service.client.post("/privacy-filter", json={"items": ["x"]}, headers={"authorization": ""})
    assert response.status == 401
    assert await response.json() == {"detail": "Missing authorization header"}
    assert fake.requests == []


async def test_device_and_dev_headers_are_not_read(filter_service) -> None:
    # App Attest is not supported here: with `use-app-attest` the bearer is still an FxA token.
    service, _ = filter_service
    response = await post_filter(
        service, {"items": [EMAIL_ITEM]}, headers={"use-app-attest": "true", "service-type": "ai-dev"}
    )
    assert response.status == 200
    assert await response.json() == MASKED


# -- enabled: the upstream call ------------------------------------------------------------


async def test_items_are_masked_through_the_filter(filter_service) -> None:
    service, fake = filter_service
    response = await post_filter(service, {"items": [EMAIL_ITEM], "user": "someone-else", "extra": 1})
    assert response.status == 200
    assert await response.json() == MASKED
    [sent] = fake.requests_to(FILTER_PATH)
    # Exactly the items: no user, no unknown field; the configured key, JSON.
    assert sent.json() == {"items": [EMAIL_ITEM]}
    assert sent.headers["x-pf-api-key"] == FILTER_KEY
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers


async def test_no_litellm_end_user_is_created(filter_service) -> None:
    service, _ = filter_service
    before = len(service.litellm.requests)
    response = await post_filter(service, {"items": ["nothing to mask"]})
    assert response.status == 200
    assert len(service.litellm.requests) == before


async def test_extra_upstream_keys_are_dropped_and_missing_ones_defaulted(filter_service) -> None:
    service, fake = filter_service
    fake.filter_body = {"results": [{"masked_text": "x", "spans": []}], "model_id": "m", "num_items": 1, "latency": 3}
    response = await post_filter(service, {"items": ["x"]})
    assert await response.json() == {"results": [{"masked_text": "x", "spans": []}], "model_id": "m", "num_items": 1}
    fake.filter_body = {"something": "else"}
    response = await post_filter(service, {"items": ["x"]})
    assert response.status == 200
    assert await response.json() == {"results": [], "model_id": None, "num_items": 0}


@pytest.mark.parametrize(
    "status, body",
    [(500, {"detail": "boom"}), (401, {"detail": "Invalid API key"}), (200, "not json"), (200, ["a", "list"])],
)
async def test_every_upstream_failure_is_one_502(filter_service, caplog, status: int, body: Any) -> None:
    service, fake = filter_service
    fake.filter_status, fake.filter_body = status, body
    response = await post_filter(service, {"items": [EMAIL_ITEM]})
    assert response.status == 502
    assert await response.json() == PROXY_FAILED
    [failure] = events(caplog, "privacy_filter_failed")
    assert failure["level"] == "ERROR"
    logged = json.dumps(events(caplog))
    assert "jane@example.com" not in logged and FILTER_KEY not in logged


async def test_a_wrong_key_is_the_filters_401_and_our_502(make_service: ServiceFactory, fake_filter_server) -> None:
    fake, server = fake_filter_server
    service = await make_service(
        PRIVACY_FILTER_ENABLED="true",
        PRIVACY_FILTER_MASTER_KEY="sk-some-other-key",
        PRIVACY_FILTER_API_BASE=str(server.make_url("")).rstrip("/"),
    )
    response = await post_filter(service, {"items": ["x"]})
    assert response.status == 502
    [sent] = fake.requests_to(FILTER_PATH)
    assert sent.headers["x-pf-api-key"] == "sk-some-other-key"


async def test_unreachable_filter_is_502(make_service: ServiceFactory) -> None:
    service = await make_service(
        PRIVACY_FILTER_ENABLED="true", PRIVACY_FILTER_MASTER_KEY=FILTER_KEY, PRIVACY_FILTER_API_BASE="http://127.0.0.1:9"
    )
    response = await post_filter(service, {"items": ["x"]})
    assert response.status == 502
    assert await response.json() == PROXY_FAILED


async def test_slow_filter_is_cut_at_the_timeout(make_service: ServiceFactory, fake_filter_server) -> None:
    fake, server = fake_filter_server
    fake.filter_delay = 5.0
    service = await make_service(
        PRIVACY_FILTER_ENABLED="true",
        PRIVACY_FILTER_MASTER_KEY=FILTER_KEY,
        PRIVACY_FILTER_API_BASE=str(server.make_url("")).rstrip("/"),
        PRIVACY_FILTER_TIMEOUT_SECONDS="0.2",
    )
    response = await post_filter(service, {"items": ["x"]})
    assert response.status == 502
    assert await response.json() == PROXY_FAILED


async def test_debug_names_the_failure(make_service: ServiceFactory, fake_filter_server) -> None:
    fake, server = fake_filter_server
    fake.filter_status, fake.filter_body = 500, {"detail": "boom"}
    service = await make_service(
        MLPA_DEBUG="true",
        PRIVACY_FILTER_ENABLED="true",
        PRIVACY_FILTER_MASTER_KEY=FILTER_KEY,
        PRIVACY_FILTER_API_BASE=str(server.make_url("")).rstrip("/"),
    )
    response = await post_filter(service, {"items": ["x"]})
    assert response.status == 502
    assert await response.json() == {"detail": {"error": "Privacy Filter answered HTTP 500"}}


async def test_lone_surrogates_are_removed_both_ways(filter_service) -> None:
    service, fake = filter_service
    raw = b'{"items": ["a\\ud800b"]}'
    headers = {"authorization": f"Bearer {service.token}", "content-type": "application/json"}
    response = await service.client.post("/privacy-filter", data=raw, headers=headers)
    assert response.status == 200
    assert fake.requests_to(FILTER_PATH)[0].json() == {"items": ["ab"]}
    fake.filter_body = {"results": ["x\ud800y"], "model_id": "m", "num_items": 1}
    response = await service.client.post("/privacy-filter", data=raw, headers=headers)
    assert (await response.json())["results"] == ["xy"]


# -- the trailing slash ----------------------------------------------------------------------


async def test_trailing_slash_redirects_307(filter_service) -> None:
    service, _ = filter_service
    response = await post_filter(service, {"items": [EMAIL_ITEM]}, path="/privacy-filter/", allow_redirects=False)
    assert response.status == 307
    assert response.headers["Location"] == "/privacy-filter"
    followed = await post_filter(service, {"items": [EMAIL_ITEM]}, path="/privacy-filter/")
    assert followed.status == 200
    assert await followed.json() == MASKED


# -- metrics ------------------------------------------------------------------------------------


async def test_generic_instrumentation_labels_the_route(filter_service) -> None:
    service, _ = filter_service
    await post_filter(service, {"items": ["x"]})
    registry = service.app[keys.METRICS].registry
    assert registry.get_sample_value(
        "mlpa_request_latency_seconds_count", {"method": "POST", "endpoint": "/privacy-filter"}
    ) == 1
    # No service type or purpose on this route: the labels every route without them gets.
    labels = {"method": "POST", "endpoint": "/privacy-filter", "service_type": "", "purpose": ""}
    samples = [s for m in registry.collect() if m.name == "mlpa_requests" for s in m.samples if s.name == "mlpa_requests_total"]
    assert any(labels.items() <= sample.labels.items() and sample.value == 1 for sample in samples), samples


# -- settings ---------------------------------------------------------------------------------


def test_the_default_key_is_refused_only_while_the_filter_is_on() -> None:
    assert Settings.from_environ(TEST_SECRETS).privacy_filter.enabled is False
    with pytest.raises(SettingsError, match=r"PRIVACY_FILTER_MASTER_KEY: not set.*while PRIVACY_FILTER_ENABLED is on"):
        Settings.from_environ({**TEST_SECRETS, "PRIVACY_FILTER_ENABLED": "true"})
    with pytest.raises(SettingsError, match="PRIVACY_FILTER_MASTER_KEY: still the documented default"):
        Settings.from_environ({**TEST_SECRETS, "PRIVACY_FILTER_ENABLED": "true", "PRIVACY_FILTER_MASTER_KEY": "sk-default"})
    settings = Settings.from_environ({**TEST_SECRETS, "PRIVACY_FILTER_ENABLED": "true", "PRIVACY_FILTER_MASTER_KEY": "k"})
    assert settings.privacy_filter.master_key == "k"
    assert "k" in settings.secret_values()
    assert settings.privacy_filter.api_base == "http://localhost:5000"


# -- readiness -----------------------------------------------------------------------------------


async def readiness(service: Service) -> tuple[int, dict[str, Any]]:
    response = await service.client.get("/health/readiness")
    return response.status, await response.json()


async def test_readiness_reports_a_ready_filter(filter_service) -> None:
    service, fake = filter_service
    status, body = await readiness(service)
    assert status == 200
    assert body["privacy_filter"] == {"version": fake.version, "model_id": fake.model_id}
    assert list(body)[:5] == ["status", "mlpa_version", "pg_server_dbs", "litellm", "privacy_filter"]
    [probe] = fake.requests_to(READYZ_PATH)
    assert "x-pf-api-key" not in probe.headers and "authorization" not in probe.headers


async def test_readiness_503_when_the_filter_says_not_ready(reference_readiness) -> None:
    service, fake = reference_readiness
    fake.ready = False
    status, body = await readiness(service)
    assert status == 503
    assert body["status"] == "degraded"
    assert body["privacy_filter"] == {"version": fake.version, "model_id": fake.model_id}


async def test_a_filter_not_ready_leaves_the_pod_ready_by_default_and_says_so(filter_service) -> None:
    """D64: the Privacy Filter is a shared dependency; its state is in the body and the metric."""
    service, fake = filter_service
    fake.ready = False
    status, body = await readiness(service)
    assert status == 200
    assert body["status"] == "degraded"
    assert body["privacy_filter"] == {"version": fake.version, "model_id": fake.model_id}
    assert sample(service, "mlpa_dependency_up", {"dependency": "privacy_filter"}) == 0
    fake.ready = True
    status, body = await readiness(service)
    assert (status, body["status"]) == (200, "connected")
    assert sample(service, "mlpa_dependency_up", {"dependency": "privacy_filter"}) == 1


@pytest.mark.parametrize("ready_value", ["true", 1, None])
async def test_only_json_true_is_ready(reference_readiness, ready_value: Any) -> None:
    service, fake = reference_readiness
    fake.readyz_body = {"ready": ready_value}
    status, body = await readiness(service)
    assert status == 503
    assert body["privacy_filter"] == {"version": None, "model_id": None}


@pytest.mark.parametrize("status_code, readyz_body", [(503, {"ready": True}), (200, "not json"), (200, ["x"])])
async def test_unreachable_filter_makes_readiness_503(
    reference_readiness, status_code: int, readyz_body: Any
) -> None:
    service, fake = reference_readiness
    fake.readyz_status, fake.readyz_body = status_code, readyz_body
    status, body = await readiness(service)
    assert status == 503
    assert body["privacy_filter"] == {"version": "N/A", "status": "unreachable"}


async def test_slow_filter_readiness_is_cut_at_the_readiness_bound(make_service: ServiceFactory, fake_filter_server) -> None:
    fake, server = fake_filter_server
    fake.readyz_delay = 5.0
    service = await make_service(
        PRIVACY_FILTER_ENABLED="true",
        PRIVACY_FILTER_MASTER_KEY=FILTER_KEY,
        PRIVACY_FILTER_API_BASE=str(server.make_url("")).rstrip("/"),
        READINESS_CHECK_TIMEOUT_S="0.2",
        READINESS_REQUIRES_DEPENDENCIES="true",
    )
    status, body = await readiness(service)
    assert status == 503
    assert body["privacy_filter"] == {"version": "N/A", "status": "unreachable"}


async def test_disabled_filter_is_never_asked_and_does_not_affect_readiness(service: Service, fake_filter_server) -> None:
    fake, _ = fake_filter_server
    status, body = await readiness(service)
    assert status == 200
    assert body["privacy_filter"] == {"status": "disabled"}
    assert fake.requests == []
