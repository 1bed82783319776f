"""Security headers on every kind of response (compatibility.md §5.1) and the request size limit on
every body route, chunked uploads included (compatibility.md D7)."""

from __future__ import annotations

import datetime
import json
import ssl
from typing import AsyncIterator

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mlpa_aiohttp.app import create_app

from ..conftest import Service, ServiceFactory, chat_body, make_settings

HSTS = "max-age=31536000; includeSubDomains"
LIMIT = 4096


def assert_nosniff(response: aiohttp.ClientResponse) -> None:
    assert response.headers.get("X-Content-Type-Options") == "nosniff", dict(response.headers)


# -- nosniff on every kind of response -------------------------------------------------------


async def test_nosniff_on_json(service: Service) -> None:
    response = await service.client.get("/health/liveness")
    assert response.status == 200
    assert_nosniff(response)
    assert "Strict-Transport-Security" not in response.headers


async def test_nosniff_on_a_completion(service: Service) -> None:
    response = await service.chat()
    assert response.status == 200
    assert_nosniff(response)


async def test_nosniff_on_a_stream(service: Service) -> None:
    response = await service.chat(chat_body(stream=True))
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert_nosniff(response)
    assert (await response.text()).endswith("data: [DONE]\n\n")


async def test_nosniff_on_the_metrics_exposition(service: Service) -> None:
    response = await service.client.get("/metrics")
    assert_nosniff(response)


async def test_nosniff_on_404(service: Service) -> None:
    response = await service.client.get("/no/such/path")
    assert response.status == 404
    assert_nosniff(response)


async def test_nosniff_on_405(service: Service) -> None:
    response = await service.client.get("/v1/chat/completions")
    assert response.status == 405
    assert "POST" in response.headers["Allow"]
    assert_nosniff(response)


async def test_nosniff_on_422(service: Service) -> None:
    response = await service.client.post("/v1/chat/completions", data=json.dumps(chat_body()))
    assert response.status == 422
    assert_nosniff(response)


async def test_nosniff_on_401(service: Service) -> None:
    response = await service.chat(headers=service.headers(authorization="Bearer not-a-token"))
    assert response.status == 401
    assert_nosniff(response)


async def test_nosniff_on_413_by_content_length(make_service: ServiceFactory) -> None:
    service = await make_service(MAX_REQUEST_SIZE_BYTES=str(LIMIT))
    response = await service.client.post(
        "/v1/chat/completions", data=b"x" * (LIMIT + 1), headers=service.headers()
    )
    assert response.status == 413
    assert await response.json() == {"error": 3}
    assert_nosniff(response)


# -- HSTS ---------------------------------------------------------------------------------------


async def test_hsts_when_forwarded_proto_is_https(service: Service) -> None:
    response = await service.client.get("/health/liveness", headers={"X-Forwarded-Proto": "https"})
    assert response.headers["Strict-Transport-Security"] == HSTS
    assert_nosniff(response)


@pytest.mark.parametrize("proto", ["http", "HTTPS", "https, http", ""])
async def test_no_hsts_unless_forwarded_proto_is_exactly_https(service: Service, proto: str) -> None:
    response = await service.client.get("/health/liveness", headers={"X-Forwarded-Proto": proto})
    assert "Strict-Transport-Security" not in response.headers


async def test_hsts_on_a_stream_and_an_error(service: Service) -> None:
    forwarded = {"X-Forwarded-Proto": "https"}
    stream = await service.chat(chat_body(stream=True), headers=service.headers(**forwarded))
    await stream.read()
    missing = await service.client.get("/nope", headers=forwarded)
    assert stream.headers["Strict-Transport-Security"] == HSTS
    assert missing.headers["Strict-Transport-Security"] == HSTS


async def test_hsts_without_include_subdomains(make_service: ServiceFactory) -> None:
    service = await make_service(HSTS_INCLUDE_SUBDOMAINS="false", HSTS_MAX_AGE="600")
    response = await service.client.get("/health/liveness", headers={"X-Forwarded-Proto": "https"})
    assert response.headers["Strict-Transport-Security"] == "max-age=600"


async def test_disable_switch_removes_every_security_header(make_service: ServiceFactory) -> None:
    service = await make_service(SECURITY_HEADERS_ENABLED="false")
    response = await service.client.get("/health/liveness", headers={"X-Forwarded-Proto": "https"})
    assert response.status == 200
    assert "X-Content-Type-Options" not in response.headers
    assert "Strict-Transport-Security" not in response.headers


def _self_signed_context(tmp_path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return context


async def test_hsts_when_served_over_tls(aiohttp_server, fake_litellm_server, fake_fxa_server, tmp_path) -> None:
    (_, litellm_server), (_, fxa_server) = fake_litellm_server, fake_fxa_server
    settings = make_settings(str(litellm_server.make_url("")).rstrip("/"), str(fxa_server.make_url("/v1")))
    server = await aiohttp_server(create_app(settings), ssl=_self_signed_context(tmp_path))
    url = server.make_url("/health/liveness")
    assert url.scheme == "https"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as session:
        async with session.get(url) as response:
            assert response.status == 200
            assert response.headers["Strict-Transport-Security"] == HSTS
            assert_nosniff(response)


# -- 413 on every body route, chunked uploads included ------------------------------------------

# Route, and the 413 body it must answer.
BODY_ROUTES = [
    ("/v1/chat/completions", {"error": 3}),
    ("/v1/search", {"detail": {"error": 3}}),
    ("/mock/chat/completions", {"detail": {"error": 3}}),
    ("/mock/chat/completions_no_auth", {"detail": {"error": 3}}),
    ("/verify/play", {"detail": {"error": 3}}),
    ("/user/someone/budget", {"detail": {"error": 3}}),
]


async def _chunks(total: int) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        piece = b" " * min(1024, total - sent)
        sent += len(piece)
        yield piece


def _body_headers(service: Service) -> dict[str, str]:
    # The admin key too: the budget route checks it before it reads the body.
    return {**service.headers(), "content-type": "application/json", "master-key": "Bearer sk-test-master"}


@pytest.fixture
async def limited_service(make_service: ServiceFactory) -> Service:
    return await make_service(MAX_REQUEST_SIZE_BYTES=str(LIMIT), MLPA_MOCK_ROUTES="true")


@pytest.mark.parametrize("path, expected", BODY_ROUTES)
async def test_oversized_chunked_body_is_413(limited_service: Service, path: str, expected: dict) -> None:
    response = await limited_service.client.post(
        path, data=_chunks(LIMIT * 3), headers=_body_headers(limited_service)
    )
    assert response.request_info.headers.get("Transfer-Encoding") == "chunked"
    assert response.status == 413
    assert await response.json() == expected
    assert_nosniff(response)


@pytest.mark.parametrize("path, expected", BODY_ROUTES)
async def test_oversized_body_by_content_length_is_413(limited_service: Service, path: str, expected: dict) -> None:
    response = await limited_service.client.post(path, data=b" " * (LIMIT + 1), headers=limited_service.headers())
    assert response.status == 413
    assert await response.json() == expected


async def test_body_at_the_limit_is_not_rejected(limited_service: Service) -> None:
    body = json.dumps(chat_body()).encode()
    padded = body + b" " * (LIMIT - len(body))
    assert len(padded) == LIMIT
    response = await limited_service.client.post("/v1/chat/completions", data=padded, headers=limited_service.headers())
    assert response.status == 200
