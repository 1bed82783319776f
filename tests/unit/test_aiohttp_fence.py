"""The two uses of aiohttp internals (the relay fast path, the direct upstream connector)
check once at start that the running aiohttp is in the tested range and has what they use;
otherwise they stay off with one WARNING naming the version, and the public path serves."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from packaging.requirements import Requirement

from mlpa_aiohttp.process import aiohttp_internals
from mlpa_aiohttp.relay import fast_path
from tests.conftest import chat_body, events

LOWEST = ".".join(map(str, aiohttp_internals.TESTED_LOWEST))
HIGHEST = ".".join(map(str, aiohttp_internals.TESTED_HIGHEST))
MAJOR, MINOR, PATCH = aiohttp_internals.TESTED_HIGHEST
NEXT_PATCH = f"{MAJOR}.{MINOR}.{PATCH + 1}"  # a security release setup.cfg allows and the range does not name


def test_the_running_aiohttp_is_in_the_tested_range() -> None:
    # CI runs the relay suites on both ends (.ci/run); a version outside would fence both off.
    assert aiohttp_internals.fence("test", [])


@pytest.mark.parametrize("version", [LOWEST, HIGHEST])
def test_both_ends_of_the_range_pass(version: str, caplog) -> None:
    assert aiohttp_internals.fence("test", [], version=version)
    assert events(caplog, "aiohttp_internals_fenced_off") == []


@pytest.mark.parametrize(
    "version", ["3.13.5", NEXT_PATCH, "3.15.0", "4.0.0", f"{NEXT_PATCH}a1", f"{HIGHEST}.dev0", "nonsense"]
)
def test_a_version_outside_the_range_is_fenced_off_with_one_warning(version: str, caplog) -> None:
    assert not aiohttp_internals.fence("relay fast path", [], version=version)
    [line] = events(caplog, "aiohttp_internals_fenced_off")
    assert line["level"] == "WARNING"
    assert (line["use"], line["aiohttp_version"]) == ("relay fast path", version)
    assert line["tested_range"] == f"{LOWEST}-{HIGHEST}"


def test_setup_cfg_allows_the_tested_range_and_later_patches_only() -> None:
    """setup.cfg's bound starts at the tested range and lets the same minor's patch releases
    in (security fixes); the fence, not the bound, keeps an untested one off the internals."""
    parser = configparser.ConfigParser()
    parser.read(Path(__file__).parents[2] / "setup.cfg")
    lines = [line.split("#")[0].strip() for line in parser["options"]["install_requires"].splitlines()]
    [requirement] = [Requirement(line) for line in lines if line and Requirement(line).name == "aiohttp"]
    allowed = requirement.specifier
    assert {(clause.operator, clause.version) for clause in allowed} == {(">=", LOWEST), ("<", f"{MAJOR}.{MINOR + 1}")}
    assert all(allowed.contains(version) for version in (LOWEST, HIGHEST, NEXT_PATCH))


def test_a_newer_patch_setup_cfg_allows_takes_the_public_path(caplog) -> None:
    assert not fast_path.usable(version=NEXT_PATCH)
    [line] = events(caplog, "aiohttp_internals_fenced_off")
    assert (line["level"], line["aiohttp_version"], line["fallback"]) == ("WARNING", NEXT_PATCH, "public aiohttp API")


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


async def test_a_fenced_off_aiohttp_serves_streams_on_the_public_path(make_service, monkeypatch, caplog) -> None:
    monkeypatch.setattr(aiohttp, "__version__", "3.15.0")
    service = await make_service(RELAY_FAST_PATH="true")
    uses = sorted(line["use"] for line in events(caplog, "aiohttp_internals_fenced_off"))
    assert uses == ["direct upstream connector", "relay fast path"]  # once each, at start
    service.litellm.interval = 0.005  # a stream the fast path would take over, were it on
    for _ in range(2):
        response = await service.chat(chat_body(stream=True))
        body = await response.read()
        assert response.status == 200 and body.endswith(b"data: [DONE]\n\n")
    assert len(events(caplog, "aiohttp_internals_fenced_off")) == 2


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
