"""The wheel (and so the image, which installs the same files) holds what production and the
demo run, and none of the tests' own fakes and launchers; the demo runs from it alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import assert_demo_streams_a_completion

REPO = Path(__file__).resolve().parents[2]
# What the Dockerfile copies into its build stage: the wheel is built from exactly these.
BUILD_CONTEXT = ("setup.cfg", "pyproject.toml", "README.md", "mlpa_aiohttp")
# The `demo`, `stack` and `fake-upstream` commands' fakes: all `mlpa_aiohttp.testing` may hold.
DEMO_FAKES = {
    "mlpa_aiohttp/testing/__init__.py",
    "mlpa_aiohttp/testing/fake_fxa.py",
    "mlpa_aiohttp/testing/fake_litellm.py",
    "mlpa_aiohttp/testing/fake_privacy_filter.py",  # the demo serves /privacy-filter through it
    "mlpa_aiohttp/testing/litellm_schema.py",
    "mlpa_aiohttp/testing/stack.py",
}
TEST_ONLY_MODULES = ("postgres", "fake_sentry", "fake_google", "app_attest_device", "fake_provider")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A fresh copy, not the checkout: setuptools' build/ directory keeps files a previous
    # build copied, so a module deleted since could still reach a wheel built in place.
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_CONTEXT:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))
        else:
            shutil.copy2(origin, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--quiet", "--wheel-dir", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("mlpa_aiohttp-*.whl")
    return built


def test_wheel_holds_no_test_only_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in TEST_ONLY_MODULES:
        assert f"mlpa_aiohttp/testing/{module}.py" not in names
    assert {name for name in names if name.startswith("mlpa_aiohttp/testing/")} == DEMO_FAKES
    assert not [name for name in names if name.startswith("tests/")]
    # The production pieces that are data files rather than modules are there.
    assert "mlpa_aiohttp/store/migrations/0001_challenges.sql" in names
    assert "mlpa_aiohttp/data/Apple_App_Attestation_Root_CA.pem" in names


async def test_demo_runs_from_the_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    # A pure-Python wheel unpacked onto PYTHONPATH is that wheel installed; the dependencies
    # come from this interpreter's site-packages, which PYTHONPATH entries precede.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "LOG_LEVEL": "WARNING"}
    where = subprocess.run(
        [sys.executable, "-c", "import mlpa_aiohttp, importlib.util as u;"
         " print(mlpa_aiohttp.__file__, u.find_spec('tests'))"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    module_file, tests_spec = where.stdout.split()
    assert Path(module_file).is_relative_to(site)
    assert tests_spec == "None"  # the checkout's tests are out of reach
    await assert_demo_streams_a_completion(env, cwd=str(tmp_path))
