"""Listen addresses: parsing HOST:PORT, and refusing one another process holds.

Every listener `serve` opens (gRPC, /metrics, the dashboard) must fail at start
when its address is taken, rather than share it: a shared port splits calls
between two servers and two databases with nothing in any log.
"""

from __future__ import annotations

import errno
import socket


def split_address(address: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as a host and a port; ValueError otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def reason(exc: OSError) -> str:
    """An OSError in the system's words, without the errno prefix."""
    return exc.strerror or str(exc)


def ensure_free(flag: str, address: str) -> None:
    """ValueError naming `flag` when any address `address` resolves to is
    already listened on. gRPC would bind the free ones and carry on (a name
    like `localhost` resolves to both 127.0.0.1 and ::1), so each is tried."""
    host, port = split_address(address)
    if port == 0:
        return
    try:
        resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"{flag}: cannot bind {address}: {reason(exc)}") from None
    for family, kind, protocol, _, where in resolved:
        with socket.socket(family, kind, protocol) as probe:
            # As every listener here binds: SO_REUSEADDR (a port in TIME_WAIT is
            # free), never SO_REUSEPORT (a listening one is not).
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(where)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ValueError(
                        f"{flag}: cannot bind {address}: {reason(exc)} (another process listens there)"
                    ) from None


def join_address(host: str, port: int) -> str:
    """HOST:PORT, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def hold_shared(flag: str, address: str) -> tuple[list[socket.socket], str]:
    """Bind (without listening) every address `address` resolves to with
    SO_REUSEPORT, and return the sockets and the address with its port made
    concrete. While they are held, only processes of this user that also set
    SO_REUSEPORT can bind the port: the `serve --processes` siblings, which
    listen on it. The held sockets never listen, so no connection waits on them."""
    host, port = split_address(address)
    try:
        resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"{flag}: cannot bind {address}: {reason(exc)}") from None
    held: list[socket.socket] = []
    try:
        for family, kind, protocol, _, where in resolved:
            sock = socket.socket(family, kind, protocol)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind((where[0], port, *where[2:]))
            except OSError as exc:
                raise ValueError(f"{flag}: cannot bind {address}: {reason(exc)}") from None
            port = port or sock.getsockname()[1]  # port 0: the first one's, for all of them
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return held, join_address(host, port)
