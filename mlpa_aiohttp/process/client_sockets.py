"""Dead-peer detection on client connections: TCP keepalive and TCP_USER_TIMEOUT.

A client that vanishes without a FIN or an RST (a phone losing its network) sends nothing,
so without help from the kernel its stream would go on until the completion ends. With

* keepalive: after `idle` seconds without anything received, the kernel probes every
  `interval` seconds; a live peer's kernel answers, whatever its application does;
* TCP_USER_TIMEOUT: data we sent that stays unacknowledged for `user_timeout` seconds ends
  the connection (and, since it is set, it also replaces the probe count as keepalive's
  give-up rule: Linux gives up at the first unanswered probe once `user_timeout` has passed
  since the peer's last segment);

the connection fails with ETIMEDOUT, aiohttp's connection-lost callback cancels the stream's
handler, and the upstream request is closed. The relay logs it as an abort with
`disconnect_reason: client_timeout`. A dead peer is therefore noticed within
`dead_peer_bound_seconds()` of its last segment, idle or mid-stream.

A healthy client is never cut: keepalive probes are answered by the client's kernel, and
every ACK of a streaming client resets both clocks. Only a client whose receive window has
stayed closed (it stopped reading) for `user_timeout` seconds is treated as gone, as recent
Linux kernels apply TCP_USER_TIMEOUT to zero-window probing too.

On Linux, sockets accepted from a listening socket inherit these options, so they are set
once on the listener (`serve`'s socket, gunicorn's listeners in `config/gunicorn.conf.py`),
at no cost per connection. Elsewhere, where the options do not exist, this is a no-op.
"""

from __future__ import annotations

import math
import socket

from ..settings import DeadPeerOptions


def supported() -> bool:
    return all(hasattr(socket, name) for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT", "TCP_USER_TIMEOUT"))


def apply(sock: socket.socket, options: DeadPeerOptions) -> bool:
    """Set keepalive and the user timeout on `sock` (a listener or a connection); returns
    whether they were set (False where the platform lacks them)."""
    if not supported() or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, math.ceil(options.idle_seconds)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, math.ceil(options.interval_seconds)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, options.count))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(options.user_timeout_seconds * 1000))
    return True


def read(sock: socket.socket) -> DeadPeerOptions | None:
    """The options as the kernel has them on `sock` (None where unsupported or keepalive is off)."""
    if not supported() or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE):
        return None
    return DeadPeerOptions(
        idle_seconds=sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        interval_seconds=sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        count=sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        user_timeout_seconds=sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) / 1000,
    )


def listening_socket(host: str, port: int, options: DeadPeerOptions, *, backlog: int) -> socket.socket:
    """A bound, listening TCP socket whose accepted connections get `options`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        apply(sock, options)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
