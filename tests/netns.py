"""A network namespace for one process, joined to this one by a veth pair, whose
traffic to one TCP port can be dropped and let through again.

The partition experiment runs one replica in it: the database listens on the
pair's outer end, the replica reaches it through the inner end, and an nft rule
inside the namespace drops that traffic both ways, as a failed switch or a
firewall would (packets vanish: no reset, no error, just silence). Everything
else keeps flowing, so a test still reaches the replica's gRPC port and sees
what it answers while it cannot reach its database.

The addresses come from TEST-NET-1 (192.0.2.0/24, which no real network
routes) and sit on the pair's two ends only; the rules live in the
namespace's own table, so the machine's own firewall is never touched.
Deleting the namespace deletes the pair with it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess

TABLE = "leasehold_partition"


def missing() -> str | None:
    """Why a namespace cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install {package})"
    return None


def _run(*args: str, stdin: str | None = None) -> None:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")


class NetworkNamespace:
    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"leasehold-{tag}"
        self._outer_link = f"lh{tag}o"  # interface names: at most 15 characters
        self._inner_link = f"lh{tag}i"
        # A /30 of TEST-NET-1 of this run's own, so two runs at once do not clash.
        base = 4 * secrets.randbelow(64)
        self.outer_address = f"192.0.2.{base + 1}"
        self.inner_address = f"192.0.2.{base + 2}"

    @property
    def prefix(self) -> tuple[str, ...]:
        """Put this before a command to run it inside the namespace."""
        return ("ip", "netns", "exec", self.name)

    def _inside(self, *args: str, stdin: str | None = None) -> None:
        _run(*self.prefix, *args, stdin=stdin)

    def create(self) -> NetworkNamespace:
        _run("ip", "netns", "add", self.name)
        _run("ip", "link", "add", self._outer_link, "type", "veth", "peer", "name", self._inner_link)
        _run("ip", "link", "set", self._inner_link, "netns", self.name)
        _run("ip", "address", "add", f"{self.outer_address}/30", "dev", self._outer_link)
        _run("ip", "link", "set", self._outer_link, "up")
        self._inside("ip", "address", "add", f"{self.inner_address}/30", "dev", self._inner_link)
        self._inside("ip", "link", "set", self._inner_link, "up")
        self._inside("ip", "link", "set", "lo", "up")
        self._inside(
            "nft",
            "-f",
            "-",
            stdin=(
                f"table inet {TABLE} {{\n"
                "  chain output { type filter hook output priority 0; policy accept; }\n"
                "  chain input { type filter hook input priority 0; policy accept; }\n"
                "}\n"
            ),
        )
        return self

    def cut(self, port: int) -> None:
        """Drop every packet between the namespace and `port` on the outer end, both ways."""
        self._inside(
            "nft",
            "-f",
            "-",
            stdin=(
                f"add rule inet {TABLE} output ip daddr {self.outer_address} tcp dport {port} drop\n"
                f"add rule inet {TABLE} input ip saddr {self.outer_address} tcp sport {port} drop\n"
            ),
        )

    def heal(self) -> None:
        """Let that traffic through again; connections that outlived the cut carry on."""
        self._inside(
            "nft", "-f", "-", stdin=f"flush chain inet {TABLE} output\nflush chain inet {TABLE} input\n"
        )

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            _run("ip", "netns", "delete", self.name)
        with contextlib.suppress(Exception):  # gone with the namespace, unless that failed
            _run("ip", "link", "delete", self._outer_link)
