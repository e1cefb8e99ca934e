"""chexflow.ports: the loopback ports picked for local services lie outside the kernel's
ephemeral range (where an outgoing connection could take one before its service binds it)."""

from __future__ import annotations

import socket

from chexflow import ports


def test_picked_ports_are_below_the_ephemeral_range_distinct_and_bindable():
    picked: list[int] = []
    for _ in range(40):
        picked.append(ports.free_port(picked))
    assert len(set(picked)) == 40
    assert all(ports.LOWEST <= p < ports.ephemeral_low() for p in picked)
    for port in picked[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_picked(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        assert not ports.port_free(busy)
        tries = iter([busy, busy, busy + 1 if busy + 1 < 65536 else busy - 1])
        monkeypatch.setattr(ports.random, "randrange", lambda lo, hi: next(tries))
        monkeypatch.setattr(ports, "ephemeral_low", lambda: 65536)
        assert ports.free_port() != busy


def test_a_port_listened_on_another_address_is_not_free():
    """A real node's apiserver or kubelet listens on the node's address, not loopback."""
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        assert not ports.port_free(held.getsockname()[1])
