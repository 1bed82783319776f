"""Dead-peer options: set once on the listening socket, inherited by accepted connections
(Linux), read back from the kernel with getsockopt; and gunicorn's hook sets them."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlpa_aiohttp.process import client_sockets
from mlpa_aiohttp.settings import DeadPeerOptions, Settings

needs_linux_options = pytest.mark.skipif(not client_sockets.supported(), reason="TCP keepalive options are Linux only")
OPTIONS = DeadPeerOptions(idle_seconds=7, interval_seconds=3, count=4, user_timeout_seconds=11.5)


@needs_linux_options
def test_accepted_connections_inherit_the_listeners_options():
    with client_sockets.listening_socket("127.0.0.1", 0, OPTIONS, backlog=16) as listener:
        listener.setblocking(True)
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert client_sockets.read(accepted) == OPTIONS
                # The client side was not touched: the options come from the listener.
                assert client_sockets.read(client) is None


def test_the_bound_follows_the_options():
    assert OPTIONS.bound_seconds() == 11.5 + 3
    assert DeadPeerOptions(60, 10, 6, 120).bound_seconds() == 130
    assert DeadPeerOptions(60, 10, 6, 0).bound_seconds() == 60 + 10 * 6
    assert DeadPeerOptions(30, 5, 2, 10).bound_seconds() == 35


def test_settings_read_the_variables():
    server = Settings.from_environ(
        {
            "MLPA_DEBUG": "true",
            "CLIENT_KEEPALIVE_IDLE_SECONDS": "7",
            "CLIENT_KEEPALIVE_INTERVAL_SECONDS": "3",
            "CLIENT_KEEPALIVE_COUNT": "4",
            "CLIENT_USER_TIMEOUT_SECONDS": "11.5",
        }
    ).server
    assert server.dead_peer_options() == OPTIONS
    assert Settings.from_environ({"MLPA_DEBUG": "true"}).server.dead_peer_options().bound_seconds() == 130


@needs_linux_options
def test_gunicorn_hook_sets_the_options_on_its_listeners(monkeypatch):
    spec = importlib.util.spec_from_file_location("gunicorn_conf", Path(__file__).parents[2] / "config" / "gunicorn.conf.py")
    assert spec is not None and spec.loader is not None
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    for name, value in (("CLIENT_KEEPALIVE_IDLE_SECONDS", "7"), ("CLIENT_KEEPALIVE_INTERVAL_SECONDS", "3"),
                        ("CLIENT_KEEPALIVE_COUNT", "4"), ("CLIENT_USER_TIMEOUT_SECONDS", "11.5")):
        monkeypatch.setenv(name, value)
    logged = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        server = SimpleNamespace(LISTENERS=[SimpleNamespace(sock=listener)], log=SimpleNamespace(info=lambda *a: logged.append(a)))
        conf.when_ready(server)
        with socket.create_connection(listener.getsockname()):
            accepted, _ = listener.accept()
            with accepted:
                assert client_sockets.read(accepted) == OPTIONS
    assert logged and logged[0][1] == 14.5
