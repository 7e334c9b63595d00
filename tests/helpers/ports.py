"""A TCP port for a test's rendezvous (torchrun's --master_port, a gloo TCPStore).

Asking the kernel for a free port (bind to port 0) returns one from the ephemeral range, the same
range the kernel hands to outgoing connections; with several multi-rank tests at once, the
connections of one test's gloo mesh can take the port before another test's rank 0 binds it
(seen as EADDRINUSE in the TCPStore). A random port below the ephemeral range, checked free by
binding it, is never given out to outgoing connections."""
from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000


def _ephemeral_low() -> int:
    try:
        return int(RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768            # Linux's default lower bound


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port below the ephemeral range that nothing listens on now."""
    high = _ephemeral_low() - 1
    if high - LOWEST < 1000:                 # a machine whose ephemeral range starts low
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randint(LOWEST, high)
        if _is_free(port):
            return port
    raise RuntimeError(f"no free TCP port found in {LOWEST}-{high}")
