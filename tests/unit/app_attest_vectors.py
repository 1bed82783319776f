"""Real Apple App Attest objects as a test oracle, read from the shared data folder.

The vectors (public verifier test suites and Apple's own validation-guide samples) are not
copied into the repository: they are read at test time from `MLPA_APPATTEST_VECTORS`, or
else from `shared/data/appattest-vectors` beside the repository (`<repo>/../shared/...`,
or beside one of its parent folders, for a git worktree nested deeper).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

VECTORS_ENV = "MLPA_APPATTEST_VECTORS"
_REPOSITORY = Path(__file__).resolve().parents[2]
_SHARED_VECTORS = Path("shared", "data", "appattest-vectors")


@dataclass(frozen=True)
class RealAssertion:
    name: str
    assertion_object: bytes
    client_data_hash: bytes
    # None: signed by the key the vector's own attestation certifies.
    public_key_pem: str | None
    previous_counter: int
    expected_counter: int | None


@dataclass(frozen=True)
class RealAttestation:
    name: str
    attestation_object: bytes
    client_data_hash: bytes
    key_id: bytes
    app_id: str
    production: bool
    verify_at: datetime
    assertions: tuple[RealAssertion, ...]


def vectors_dir() -> Path | None:
    configured = os.environ.get(VECTORS_ENV)
    if configured:
        return Path(configured) if Path(configured).is_dir() else None
    for parent in _REPOSITORY.parents:
        if (parent / _SHARED_VECTORS).is_dir():
            return parent / _SHARED_VECTORS
    return None


def _decode(text: str, encoding: str = "base64") -> bytes:
    text = text.strip()
    if encoding == "base64url":
        text = text.replace("-", "+").replace("_", "/")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _pem_of(record: dict) -> str | None:
    if record.get("public_key_pem"):
        return record["public_key_pem"]
    if record.get("public_key_x963_hex"):
        point = bytes.fromhex(record["public_key_x963_hex"])
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
        return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return None


def _assertion(folder: Path, vector: str, index: int, record: dict) -> RealAssertion:
    encoding = record.get("encoding", "base64")
    if "client_data_raw" in record:
        client_data = record["client_data_raw"].encode("utf-8")
    else:
        client_data = _decode(record["client_data_b64"], encoding)
    return RealAssertion(
        name=f"{vector}#{index}",
        assertion_object=_decode((folder / record["file"]).read_text(), encoding),
        client_data_hash=hashlib.sha256(client_data).digest(),
        public_key_pem=_pem_of(record),
        previous_counter=record["previous_counter"],
        expected_counter=record["expected_counter"],
    )


def load_vectors(root: Path) -> list[RealAttestation]:
    vectors = []
    for inputs_file in sorted(root.glob("*/inputs.json")):
        folder = inputs_file.parent
        inputs = json.loads(inputs_file.read_text())
        encoding = inputs.get("attestation_encoding", "base64")
        vectors.append(
            RealAttestation(
                name=inputs["name"],
                attestation_object=_decode((folder / inputs["attestation_file"]).read_text(), encoding),
                client_data_hash=bytes.fromhex(inputs["client_data_hash"]["hex"]),
                key_id=_decode(inputs["key_id_b64"]),
                app_id=f"{inputs['team_id']}.{inputs['bundle_id']}",
                production={"production": True, "development": False}[inputs["environment"]],
                verify_at=datetime.fromisoformat(inputs["verify_at"].replace("Z", "+00:00")),
                assertions=tuple(
                    _assertion(folder, inputs["name"], index, record)
                    for index, record in enumerate(inputs.get("assertions", []), start=1)
                ),
            )
        )
    return vectors
