"""Hostile App Attest objects over HTTP: the documented 403 / 401, never a 500 or an ERROR.

The bodies are garbage, mutations of genuine objects (the test device's and, when the
shared vectors are present, Apple's), pathological CBOR, and claims no app id can have.
"""

from __future__ import annotations

import base64
import random
from pathlib import Path

import cbor2
import jwt
import pytest

from tests.support.app_attest_device import TestAttestationCA, TestDevice, compact_json

from ..conftest import Service, chat_body, events
from .app_attest_vectors import load_vectors, vectors_dir

TEAM = "TESTTEAM01"  # an Apple-shaped team id; TEAMID1234, the reference default, is refused outside debug
BUNDLE = "org.mozilla.ios.Firefox"
ATTESTATION_REJECTED = {"detail": "Attestation verification failed"}
ASSERTION_REJECTED = {"detail": "Invalid App Attest assertion"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def envelope(**claims: str) -> str:
    return "Bearer " + jwt.encode(claims, "envelope-key-not-checked-by-the-server", algorithm="HS256")


def mutations(seed: bytes, rng: random.Random, count: int) -> list[bytes]:
    """Byte flips, truncations, insertions and splices of `seed`."""
    found = []
    for _ in range(count):
        data = bytearray(seed)
        operation = rng.randrange(4)
        position = rng.randrange(len(data))
        if operation == 0:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif operation == 1:
            del data[position:]
        elif operation == 2:
            data[position:position] = rng.randbytes(rng.randint(1, 9))
        else:
            data[position:] = rng.randbytes(rng.randint(0, 40))
        found.append(bytes(data))
    return found


PATHOLOGICAL_CBOR = [
    b"",
    b"\x00",
    b"\x81" * 3000 + b"\x00",  # deep nesting (the header limit bounds the size)
    b"\xa1\x00" * 1500 + b"\x00",
    b"\x5b" + b"\xff" * 8,  # a byte string that claims 2^64-1 bytes
    b"\x9b" + b"\xff" * 8,  # an array that claims 2^64-1 items
    bytes.fromhex("d81c81d81d00"),  # a shared reference to itself (a cyclic list)
    bytes.fromhex("d81e820100"),  # rational with denominator 0
    bytes.fromhex("c11bffffffffffffffff"),  # datetime out of range
    cbor2.dumps({"fmt": "apple-appattest", "attStmt": {"x5c": [b"\x30\x80"] * 4}, "authData": b"\x00" * 200}),
    cbor2.dumps({"fmt": "apple-appattest", "attStmt": {"x5c": []}, "authData": b""}),
    cbor2.dumps({"authenticatorData": b"\x00" * 37, "signature": b"\x30\x80"}),
    cbor2.dumps({"authenticatorData": "text", "signature": 5}),
]


def real_objects() -> list[bytes]:
    folder = vectors_dir()
    if folder is None:
        return []
    vectors = load_vectors(folder)
    return [vector.attestation_object for vector in vectors[:4]] + [
        assertion.assertion_object for vector in vectors for assertion in vector.assertions
    ][:4]


@pytest.fixture(scope="module")
def ca() -> TestAttestationCA:
    return TestAttestationCA()


@pytest.fixture
async def service(make_service, ca: TestAttestationCA, tmp_path: Path) -> Service:
    root = tmp_path / "root.pem"
    root.write_bytes(ca.root_pem)
    return await make_service(APP_ATTEST_ROOT_CA_PATH=str(root), APP_DEVELOPMENT_TEAM=TEAM)


async def challenge_for(service: Service, key_id_b64: str) -> str:
    response = await service.client.get("/verify/challenge", params={"key_id_b64": key_id_b64})
    assert response.status == 200
    return (await response.json())["challenge"]


async def post_attestation(
    service: Service, device: TestDevice, attestation_object: bytes | None, bundle_id: str = BUNDLE
):
    """POST `attestation_object` (None: a genuine one for the fresh challenge)."""
    challenge = await challenge_for(service, device.key_id_b64)
    if attestation_object is None:
        attestation_object = device.attest(challenge.encode())
    authorization = envelope(
        key_id_b64=device.key_id_b64,
        challenge_b64=b64(challenge.encode()),
        attestation_obj_b64=b64(attestation_object),
        bundle_id=bundle_id,
    )
    return await service.client.post("/verify/attest", headers={"authorization": authorization})


async def post_assertion(service: Service, device: TestDevice, assertion_object: bytes, body: bytes, bundle_id: str = BUNDLE):
    challenge = await challenge_for(service, device.key_id_b64)
    authorization = envelope(
        key_id_b64=device.key_id_b64,
        challenge_b64=b64(challenge.encode()),
        assertion_obj_b64=b64(assertion_object),
        bundle_id=bundle_id,
    )
    headers = {"authorization": authorization, "service-type": "ai", "use-app-attest": "true"}
    return await service.client.post("/v1/chat/completions", data=body, headers=headers)


def assert_no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [event for event in events(caplog) if event["level"] in ("ERROR", "CRITICAL")]
    assert errors == []


async def test_hostile_attestation_objects_are_403(service: Service, ca: TestAttestationCA, caplog) -> None:
    rng = random.Random(12)
    device = TestDevice(ca, TEAM, BUNDLE)
    genuine = device.attest(b"unused challenge")  # genuine shape, but for another challenge
    bodies = PATHOLOGICAL_CBOR + mutations(genuine, rng, 40) + real_objects() + [rng.randbytes(300)]
    for body in bodies:
        response = await post_attestation(service, device, body)
        assert (response.status, await response.json()) == (403, ATTESTATION_REJECTED), body[:40].hex()
    assert_no_error_logged(caplog)


async def test_hostile_assertion_objects_are_401(service: Service, ca: TestAttestationCA, caplog) -> None:
    rng = random.Random(12)
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    attested = await service.client.post("/verify/attest", headers={"authorization": device.attestation_jwt(challenge)})
    assert attested.status == 201
    body = compact_json(chat_body())
    genuine = device.assertion(body, 1)
    bodies = PATHOLOGICAL_CBOR + mutations(genuine, rng, 40) + real_objects() + [rng.randbytes(120)]
    for assertion_object in bodies:
        response = await post_assertion(service, device, assertion_object, body)
        assert (response.status, await response.json()) == (401, ASSERTION_REJECTED), assertion_object[:40].hex()
    # The key still works: none of that advanced or damaged its counter.
    response = await post_assertion(service, device, genuine, body)
    assert response.status == 200, await response.text()
    assert_no_error_logged(caplog)


HOSTILE_BUNDLE_IDS = ["\ud800", "org.mozilla\x00ios", "\U0010ffff" * 64, "x" * 5000, ""]


@pytest.mark.parametrize("bundle_id", HOSTILE_BUNDLE_IDS, ids=["lone-surrogate", "nul", "astral", "long", "empty"])
async def test_attestation_for_an_impossible_app_id_is_403(
    service: Service, ca: TestAttestationCA, bundle_id: str, caplog
) -> None:
    device = TestDevice(ca, TEAM, BUNDLE)
    assert (await post_attestation(service, device, None)).status == 201  # the same, for its own app
    response = await post_attestation(service, device, None, bundle_id=bundle_id)
    assert (response.status, await response.json()) == (403, ATTESTATION_REJECTED)
    assert_no_error_logged(caplog)


@pytest.mark.parametrize("bundle_id", HOSTILE_BUNDLE_IDS, ids=["lone-surrogate", "nul", "astral", "long", "empty"])
async def test_assertion_for_an_impossible_app_id_is_401(
    service: Service, ca: TestAttestationCA, bundle_id: str, caplog
) -> None:
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    attested = await service.client.post("/verify/attest", headers={"authorization": device.attestation_jwt(challenge)})
    assert attested.status == 201
    body = compact_json(chat_body())
    response = await post_assertion(service, device, device.assertion(body, 1), body, bundle_id=bundle_id)
    assert (response.status, await response.json()) == (401, ASSERTION_REJECTED)
    assert_no_error_logged(caplog)


async def test_a_real_size_attestation_envelope_reaches_the_verifier(service: Service, ca: TestAttestationCA) -> None:
    """A real attestation object is 5.2-5.9 KB; base64 inside the JWT, base64 again, its
    Authorization header is about 10.7 KB, more than aiohttp's default 8190-byte field."""
    device = TestDevice(ca, TEAM, BUNDLE)
    challenge = await challenge_for(service, device.key_id_b64)
    token = device.attestation_jwt(challenge)
    assert len(token) > 8190
    response = await service.client.post("/verify/attest", headers={"authorization": f"Bearer {token}"})
    assert (response.status, await response.json()) == (201, {"status": "success"})


async def test_the_route_keeps_the_references_client_data_hash(service: Service, ca: TestAttestationCA) -> None:
    """The core takes any clientDataHash; the route derives SHA-256(challenge), as the
    reference does, so an attestation over the raw challenge (Apple's samples) is refused."""
    device = TestDevice(ca, TEAM, BUNDLE)
    for raw_client_data_hash, expected in ((True, 403), (False, 201)):
        challenge = await challenge_for(service, device.key_id_b64)
        attestation = device.attest(challenge.encode(), raw_client_data_hash=raw_client_data_hash)
        authorization = envelope(
            key_id_b64=device.key_id_b64,
            challenge_b64=b64(challenge.encode()),
            attestation_obj_b64=b64(attestation),
            bundle_id=BUNDLE,
        )
        response = await service.client.post("/verify/attest", headers={"authorization": authorization})
        assert response.status == expected, raw_client_data_hash
