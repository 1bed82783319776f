"""DB_SSL_* read at start: libpq's mode names, files that load, no setting that only looks
like safety (a root certificate with a mode that never verifies). Connections over TLS:
tests/integration/test_postgres_tls.py."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from mlpa_aiohttp.settings import PostgresTLS, Settings, SettingsError
from tests.support.tls_certificates import TestCA

DEBUG = {"MLPA_DEBUG": "true"}


def read(**environ: str) -> PostgresTLS:
    return Settings.from_environ(DEBUG | environ).postgres.tls


def problems(**environ: str) -> tuple[str, ...]:
    with pytest.raises(SettingsError) as refused:
        Settings.from_environ(DEBUG | environ)
    return refused.value.problems


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return TestCA.create("unit CA").write(tmp_path_factory.mktemp("ca") / "ca.pem")


def test_the_default_is_asyncpgs_prefer() -> None:
    assert read() == PostgresTLS(mode="prefer")
    assert read().ssl_argument() == "prefer"


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer"])
def test_modes_that_never_verify_are_handed_to_asyncpg_by_name(mode: str) -> None:
    assert read(DB_SSL_MODE=mode.upper()).ssl_argument() == mode


def test_verify_full_checks_chain_and_name_against_the_root_certificate(ca_file: Path) -> None:
    context = read(DB_SSL_MODE="verify-full", DB_SSL_ROOT_CERT=str(ca_file)).ssl_argument()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is True
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "unit CA"),),)]


def test_verify_ca_checks_the_chain_only(ca_file: Path) -> None:
    context = read(DB_SSL_MODE="verify-ca", DB_SSL_ROOT_CERT=str(ca_file)).ssl_argument()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is False


def test_verify_full_without_a_root_certificate_trusts_the_system_store() -> None:
    context = read(DB_SSL_MODE="verify-full").ssl_argument()
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED


def test_require_without_a_root_certificate_encrypts_only() -> None:
    context = read(DB_SSL_MODE="require").ssl_argument()
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_NONE


def test_an_unknown_mode_is_refused() -> None:
    [problem] = problems(DB_SSL_MODE="verify")
    assert problem.startswith("DB_SSL_MODE: expected one of disable, allow, prefer, require, verify-ca, verify-full")


def test_a_root_certificate_with_a_mode_that_never_verifies_is_refused(ca_file: Path) -> None:
    [problem] = problems(DB_SSL_MODE="prefer", DB_SSL_ROOT_CERT=str(ca_file))
    assert problem.startswith("DB_SSL_ROOT_CERT: set, but DB_SSL_MODE=prefer does not use it")


def test_missing_and_unparsable_files_are_named(tmp_path: Path) -> None:
    [problem] = problems(DB_SSL_MODE="verify-full", DB_SSL_ROOT_CERT=str(tmp_path / "nope.pem"))
    assert problem.startswith("DB_SSL_ROOT_CERT: cannot read") and "nope.pem" in problem
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    [problem] = problems(DB_SSL_MODE="verify-full", DB_SSL_ROOT_CERT=str(garbage))
    assert problem.startswith("DB_SSL_ROOT_CERT: not usable PEM")


def test_a_client_certificate_needs_its_key(ca_file: Path, tmp_path: Path) -> None:
    [problem] = problems(DB_SSL_MODE="require", DB_SSL_CERT=str(ca_file))
    assert problem.startswith("DB_SSL_CERT and DB_SSL_KEY: set both")
    issued = TestCA.create("client CA").issue("mlpa", client=True)
    (tmp_path / "client.pem").write_bytes(issued.cert_pem)
    (tmp_path / "client.key").write_bytes(issued.key_pem)
    tls = read(DB_SSL_MODE="verify-full", DB_SSL_ROOT_CERT=str(ca_file), DB_SSL_CERT=str(tmp_path / "client.pem"),
               DB_SSL_KEY=str(tmp_path / "client.key"))
    assert isinstance(tls.ssl_argument(), ssl.SSLContext)
    # A key of another certificate does not load.
    other = TestCA.create("client CA").issue("other", client=True)
    (tmp_path / "other.key").write_bytes(other.key_pem)
    [problem] = problems(DB_SSL_MODE="require", DB_SSL_CERT=str(tmp_path / "client.pem"),
                         DB_SSL_KEY=str(tmp_path / "other.key"))
    assert "not usable PEM" in problem


def test_connection_environ_carries_the_tls_settings(ca_file: Path) -> None:
    environ = DEBUG | {"DB_SSL_MODE": "verify-full", "DB_SSL_ROOT_CERT": str(ca_file)}
    pg = Settings.from_environ(environ).postgres
    assert Settings.from_environ(DEBUG | pg.connection_environ()).postgres == pg
