"""The ingress's port, bound before anything starts: a port in use is one
line naming it, and `run` finds out before it starts a child
(docs/design.md, "One port, one deployment")."""

import errno
import socket

from webhook_ingest.shared.errors import WebhookIngestError


class PortUnavailable(WebhookIngestError):
    """The ingress cannot listen on its port."""


def listening_sockets(host: str, port: int, reuse_port: bool) -> list[socket.socket]:
    """A bound socket for every address of `host`, as aiohttp's TCPSite binds
    them (SO_REUSEADDR, IPv6 only on IPv6), with SO_REUSEPORT when asked;
    PortUnavailable saying why when one cannot be bound."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in _addresses(host, port):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not refused for a closed one's TIME_WAIT
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise PortUnavailable(_why(host, port, exc)) from None
    return sockets


def check_free(host: str, port: int) -> None:
    """PortUnavailable when anything listens on host:port, even with SO_REUSEPORT."""
    for sock in listening_sockets(host, port, reuse_port=False):
        sock.close()


def _addresses(host: str, port: int) -> list[tuple]:
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {host!r}: {exc.strerror}") from None
    return list(dict.fromkeys(found))


def _why(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} is in use: something already listens on {host}:{port} (another webhook-ingest?);"
            " stop it or choose another --port"
        )
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
