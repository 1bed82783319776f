"""The two uses of aiohttp internals (the relay fast path, the direct upstream connector)
check once at start that the running aiohttp is in the tested range and has what they use;
otherwise they stay off with one WARNING naming the version, and the public path serves."""

from __future__ import annotations

import subprocess
import sys

import aiohttp
import pytest

from mlpa_aiohttp import aiohttp_internals, keys
from mlpa_aiohttp.relay import fast_path
from mlpa_aiohttp.upstream.connector import DirectConnector, PoolAwareConnector, make_connector, missing_internals
from tests.conftest import chat_body, events

LOWEST = ".".join(map(str, aiohttp_internals.TESTED_LOWEST))
HIGHEST = ".".join(map(str, aiohttp_internals.TESTED_HIGHEST))


def test_the_running_aiohttp_is_in_the_tested_range() -> None:
    # CI runs the relay suites on both ends (.ci/run); a version outside would fence both off.
    assert aiohttp_internals.fence("test", [])


@pytest.mark.parametrize("version", [LOWEST, HIGHEST])
def test_both_ends_of_the_range_pass(version: str, caplog) -> None:
    assert aiohttp_internals.fence("test", [], version=version)
    assert events(caplog, "aiohttp_internals_fenced_off") == []


@pytest.mark.parametrize("version", ["3.13.5", "3.14.6", "3.15.0", "4.0.0", "3.14.6a1", "3.14.5.dev0", "nonsense"])
def test_a_version_outside_the_range_is_fenced_off_with_one_warning(version: str, caplog) -> None:
    assert not aiohttp_internals.fence("relay fast path", [], version=version)
    [line] = events(caplog, "aiohttp_internals_fenced_off")
    assert line["level"] == "WARNING"
    assert (line["use"], line["aiohttp_version"]) == ("relay fast path", version)
    assert line["tested_range"] == f"{LOWEST}-{HIGHEST}"


def test_a_missing_attribute_fences_off_even_in_range(caplog) -> None:
    class ReaderWithoutProtocolSlot:  # what a refactored aiohttp StreamReader might look like
        def feed_data(self, data: bytes) -> None: ...

    assert not fast_path.usable(version=HIGHEST, reader_class=ReaderWithoutProtocolSlot)
    [line] = events(caplog, "aiohttp_internals_fenced_off")
    assert "ReaderWithoutProtocolSlot._protocol" in line["missing"]
    assert "ReaderWithoutProtocolSlot.feed_eof" in line["missing"]
    assert "ReaderWithoutProtocolSlot.feed_data" not in line["missing"]


def test_the_fast_path_is_usable_on_this_aiohttp(caplog) -> None:
    assert fast_path.usable()
    assert events(caplog, "aiohttp_internals_fenced_off") == []


def test_the_connector_names_what_it_misses() -> None:
    class OtherConnector:
        async def _wrap_create_connection(self, *args, addr_infos, req, **kwargs): ...

    assert missing_internals(OtherConnector, object()) == [
        "object._local_addr_infos",
        "object._socket_factory",
        "object._loop",
        "_wrap_create_connection(timeout=)",
        "_wrap_create_connection(client_error=)",
    ]
    assert missing_internals(type("Bare", (), {}), object())[-1] == "Bare._wrap_create_connection"


async def test_the_connector_falls_back_to_aiohttps_own_outside_the_range(caplog) -> None:
    direct = make_connector(limit=5)
    fenced = make_connector(version="3.15.0", limit=5)
    try:
        assert type(direct) is DirectConnector
        # aiohttp's own connection path; only the public `connect` is extended (pooled or new).
        assert type(fenced) is PoolAwareConnector and fenced.limit == 5
        assert PoolAwareConnector._wrap_create_connection is aiohttp.TCPConnector._wrap_create_connection
        [line] = events(caplog, "aiohttp_internals_fenced_off")
        assert (line["use"], line["aiohttp_version"]) == ("direct upstream connector", "3.15.0")
    finally:
        await direct.close()
        await fenced.close()


async def test_a_fenced_off_aiohttp_serves_streams_on_the_public_path(make_service, monkeypatch, caplog) -> None:
    monkeypatch.setattr(aiohttp, "__version__", "3.15.0")
    taken: list[object] = []
    monkeypatch.setattr(fast_path.FastRelay, "take_over", classmethod(lambda cls, *a: taken.append(a)))
    service = await make_service(RELAY_FAST_PATH="true")
    assert service.app[keys.RELAY_FAST_PATH] is None
    assert not isinstance(service.app[keys.HTTP_SESSION].connector, DirectConnector)
    response = await service.chat(chat_body(stream=True))
    body = await response.read()
    assert response.status == 200 and body.endswith(b"data: [DONE]\n\n")
    assert taken == []  # the fast path was never asked
    uses = sorted(line["use"] for line in events(caplog, "aiohttp_internals_fenced_off"))
    assert uses == ["direct upstream connector", "relay fast path"]  # once each, at start


def test_nothing_private_of_aiohttp_is_imported_with_the_fast_path_off() -> None:
    """With RELAY_FAST_PATH=false the fast path's module is never imported."""
    script = (
        "import sys\n"
        "from mlpa_aiohttp.app import create_app\n"
        "from tests.conftest import make_settings\n"
        "create_app(make_settings('http://127.0.0.1:9', 'http://127.0.0.1:9', RELAY_FAST_PATH='false'))\n"
        "print('mlpa_aiohttp.relay.fast_path' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip().splitlines()[-1] == "False"
