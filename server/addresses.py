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
