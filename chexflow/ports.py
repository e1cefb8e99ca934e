"""Loopback ports for the local services chexflow starts (the dev cluster's components, Slurm).

A port picked by binding to port 0 comes from the kernel's ephemeral range, the same range every
outgoing connection takes its local port from: between the pick and the service's own bind, a
client may take it (a dev cluster's CoreDNS once failed with "bind: address already in use" on
its health port, and the cluster with it). Ports are therefore picked below that range, where
the kernel hands out nothing by itself, and checked free when picked.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from pathlib import Path

LOWEST = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 if unreadable)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_free(port: int) -> bool:
    """Whether no listener holds `port` on any of this machine's addresses now. Not loopback
    alone: a dev cluster's apiserver and kubelets listen on its real node's address, where a
    second cluster picking the same port would leave a client of one able to reach the other."""
    with socket.socket() as s:
        # as Go's listeners do: a port left in TIME_WAIT by a stopped service is free to them
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port(taken: Collection[int] = ()) -> int:
    """A port below the ephemeral range, free on every address (port_free) and not in `taken`
    (the ports already picked for the same service set)."""
    high = ephemeral_low()
    if high <= LOWEST + 100:  # a range reaching down this far leaves nothing outside it
        high = 65536
    for _ in range(1000):
        port = random.randrange(LOWEST, high)
        if port not in taken and port_free(port):
            return port
    raise OSError(f"no free loopback port in {LOWEST}-{high - 1} after 1000 tries")
