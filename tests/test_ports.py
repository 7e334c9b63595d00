"""tests/helpers/ports.py: rendezvous ports below the kernel's ephemeral range, free when given."""
import socket

from helpers import ports


def test_ports_are_below_the_ephemeral_range_and_free():
    low = ports._ephemeral_low()
    for _ in range(20):
        p = ports.free_port()
        assert ports.LOWEST <= p < low
        with socket.socket() as s:
            s.bind(("", p))          # nothing listens there: a rank 0 can bind it


def test_a_port_in_use_is_not_given(monkeypatch):
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        taken = s.getsockname()[1]
        picks = iter([taken, taken, 20_001])
        monkeypatch.setattr(ports.random.SystemRandom, "randint", lambda self, a, b: next(picks))
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: max(taken + 1, 32_768))
        assert not ports._is_free(taken)
        assert ports.free_port() == 20_001
