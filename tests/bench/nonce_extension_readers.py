"""How to read Apple's nonce extension: the candidates side by side, in one run.

The extension value is DER for SEQUENCE { [1] EXPLICIT OCTET STRING nonce }. Candidates:

* `compare`  - what the verifier does: the value must equal the six-byte DER header plus
               the nonce we computed (no parsing at all);
* `hand`     - the hand-written TLV reader the verifier used before (kept here only to be
               measured);
* `crypto`   - cryptography's declarative DER decoder (`cryptography.hazmat.asn1`,
               cryptography >= 47, documented as not yet API-stable);
* `pyasn1`   - pyasn1's DER decoder with a schema (already installed through google-auth);
* `asn1crypto` - asn1crypto (if installed; last release 2022).

For each it prints: accept/reject on 16 hand-made encodings, what exceptions escape on
20 000 random mutations of the genuine value (anything but its documented error is a 500
waiting to happen), and the median time per call.

    PYTHONPATH=. python -m tests.bench.nonce_extension_readers
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from typing import Annotated, Callable

GENUINE_HEADER = bytes.fromhex("3024a1220420")
NONCE = bytes(range(32))
GENUINE = GENUINE_HEADER + NONCE


class Rejected(Exception):
    pass


def compare(value: bytes) -> bytes:
    if value != GENUINE_HEADER + NONCE:  # the verifier compares in constant time
        raise Rejected
    return NONCE


def _read_tlv(data: bytes) -> tuple[int, bytes, bytes]:
    if len(data) < 2:
        raise ValueError("truncated TLV")
    tag, first = data[0], data[1]
    if tag & 0x1F == 0x1F:
        raise ValueError("multi-byte tag")
    offset = 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or len(data) < offset + count:
            raise ValueError("unsupported length")
        length = int.from_bytes(data[offset : offset + count], "big")
        offset += count
    if offset + length > len(data):
        raise ValueError("truncated value")
    return tag, data[offset : offset + length], data[offset + length :]


def hand(value: bytes) -> bytes:
    tag, sequence, rest = _read_tlv(value)
    if tag != 0x30 or rest:
        raise ValueError("not one SEQUENCE")
    while sequence:
        tag, content, sequence = _read_tlv(sequence)
        if tag == 0xA1:
            inner, octets, trailing = _read_tlv(content)
            if inner != 0x04 or trailing:
                raise ValueError("[1] is not one OCTET STRING")
            return octets
    raise ValueError("no [1]")


try:  # module level: the declarative decoder resolves the annotations in these globals
    from cryptography.hazmat import asn1
except ImportError:
    asn1 = None


def _crypto_reader() -> Callable[[bytes], bytes] | None:
    if asn1 is None:
        return None

    @asn1.sequence
    class NonceExtension:
        nonce: Annotated[bytes, asn1.Explicit(1)]

    return lambda value: asn1.decode_der(NonceExtension, value).nonce


def _pyasn1_reader() -> Callable[[bytes], bytes] | None:
    try:
        from pyasn1.codec.der import decoder
        from pyasn1.type import namedtype, tag, univ
    except ImportError:
        return None

    class NonceExtension(univ.Sequence):
        componentType = namedtype.NamedTypes(
            namedtype.NamedType(
                "nonce",
                univ.OctetString().subtype(explicitTag=tag.Tag(tag.tagClassContext, tag.tagFormatConstructed, 1)),
            )
        )

    def read(value: bytes) -> bytes:
        decoded, rest = decoder.decode(value, asn1Spec=NonceExtension())
        if rest:
            raise ValueError("trailing bytes")
        return bytes(decoded["nonce"])

    return read


def _asn1crypto_reader() -> Callable[[bytes], bytes] | None:
    try:
        from asn1crypto import core
    except ImportError:
        return None

    class NonceExtension(core.Sequence):
        _fields = [("nonce", core.OctetString, {"explicit": 1})]

    def read(value: bytes) -> bytes:
        return NonceExtension.load(value, strict=True)["nonce"].native

    return read


CASES = {
    "genuine": GENUINE,
    "ber-long-form": b"\x30\x81\x25\xa1\x81\x22\x04\x20" + NONCE,
    "extra-element": b"\x30\x29\xa0\x03\x02\x01\x01\xa1\x22\x04\x20" + NONCE,
    "set": b"\x31\x24\xa1\x22\x04\x20" + NONCE,
    "trailing": GENUINE + b"\x00",
    "bit-string": b"\x30\x24\xa1\x22\x03\x20" + NONCE,
    "two-in-tag": b"\x30\x26\xa1\x24\x04\x20" + NONCE + b"\x05\x00",
    "tag-2": b"\x30\x24\xa2\x22\x04\x20" + NONCE,
    "truncated": GENUINE[:-1],
    "short": b"\x30",
    "high-tag": b"\x1f\x81\x00",
    "indefinite": b"\x30\x80" + NONCE,
    "long-length": b"\x30\x85\x00\x00\x00\x00\x24",
    "constructed-octets": b"\x30\x28\xa1\x26\x24\x24\x04\x10" + NONCE[:16] + b"\x04\x10" + NONCE[16:],
    "other-nonce": GENUINE_HEADER + NONCE[::-1],
    "empty": b"",
}


def mutations(count: int, rng: random.Random) -> list[bytes]:
    found = []
    for _ in range(count):
        data = bytearray(GENUINE)
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(len(data) + 1)
            operation = rng.randrange(4)
            if operation == 0 and position < len(data):
                data[position] = rng.randrange(256)
            elif operation == 1:
                del data[position:]
            elif operation == 2:
                data[position:position] = rng.randbytes(rng.randint(1, 4))
            else:
                data[position : position + rng.randint(1, 8)] = b""
        found.append(bytes(data))
    return found


def main() -> None:
    readers: dict[str, Callable[[bytes], bytes] | None] = {
        "compare": compare,
        "hand": hand,
        "crypto": _crypto_reader(),
        "pyasn1": _pyasn1_reader(),
        "asn1crypto": _asn1crypto_reader(),
    }
    rng = random.Random(2026)
    fuzz = mutations(20_000, rng)
    print(f"{'case':20}" + "".join(f"{name:>12}" for name in readers))
    for case, value in CASES.items():
        row = []
        for read in readers.values():
            if read is None:
                row.append("n/a")
                continue
            try:
                row.append("ACCEPT" if read(value) == NONCE else "other")
            except Exception:  # noqa: BLE001 - the table records rejection of any kind
                row.append("reject")
        print(f"{case:20}" + "".join(f"{cell:>12}" for cell in row))
    print()
    for name, read in readers.items():
        if read is None:
            print(f"{name:12} not installed")
            continue
        escaped: Counter[str] = Counter()
        accepted_other = 0
        for value in fuzz:
            try:
                if read(value) == NONCE and value != GENUINE:
                    accepted_other += 1
            except Exception as exc:  # noqa: BLE001 - counting what escapes is the point
                escaped[type(exc).__name__] += 1
        timings = []
        for _ in range(7):
            started = time.perf_counter_ns()
            for _ in range(2000):
                read(GENUINE)
            timings.append((time.perf_counter_ns() - started) / 2000 / 1000)
        print(
            f"{name:12} median {statistics.median(timings):8.2f} us/call; on 20000 mutations: "
            f"{accepted_other} non-genuine values read as the nonce; exceptions {dict(escaped.most_common())}"
        )


if __name__ == "__main__":
    main()
