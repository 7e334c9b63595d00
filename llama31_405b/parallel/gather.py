"""The pre-flight's one collective, with the standard library only: every rank sends a small
object to rank 0 over TCP, rank 0 answers each with the list of all of them, in rank order.

Why not torch.distributed: the pre-flight runs on every rank of the job (8,192 on 128 racks)
only to compare where the ranks landed; importing torch costs each rank ~2.5 CPU-seconds before
any work, and a gloo group needs its own rendezvous anyway. This exchange needs no import
beyond `socket`, and it names the ranks that never joined, where a gloo timeout names none.

Protocol (one connection per rank, rank 0 listens on MASTER_ADDR's port, on every interface):
a rank sends a 16-byte header (magic, rank, world size, payload length) and a pickled payload;
when rank 0 holds all `world_size` payloads it sends every rank the zlib-compressed pickled list
(placements repeat host and rack names, so it compresses ~10x), then closes. Payloads are pickled
as torch's `all_gather_object` pickles them: only the ranks of one job talk on this port.
Rank 0 keeps one socket per rank open until it answers, so it raises its open-file limit to the
hard limit first and refuses, before listening, a world its hard limit cannot hold.
"""
from __future__ import annotations

import pickle
import random
import resource
import selectors
import socket
import struct
import time
import zlib

MAGIC = b"L405"
_HEADER = struct.Struct("!4sIII")  # magic, rank, world size, payload bytes
_LENGTH = struct.Struct("!Q")
MAX_PAYLOAD = 1 << 20
"""Bytes one rank may send: a placement is ~200 bytes; anything larger is not this protocol."""


class GatherError(RuntimeError):
    """The exchange failed: a rank did not join in time, sent something else, or rank 0 went away.
    `from_rank0`: this rank only saw rank 0 give up, and rank 0 says why (one message, not one
    per rank)."""

    def __init__(self, message: str, *, from_rank0: bool = False):
        super().__init__(message)
        self.from_rank0 = from_rank0


def all_gather(obj, *, rank: int, world_size: int, addr: str, port: int,
               timeout_s: float) -> list:
    """Every rank's `obj`, index = rank; the same list on every rank. Raises GatherError."""
    if world_size == 1:
        return [obj]
    payload = pickle.dumps(obj)
    if len(payload) > MAX_PAYLOAD:
        raise GatherError(f"rank {rank}: payload of {len(payload)} bytes > {MAX_PAYLOAD}")
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        return _serve(payload, world_size, port, deadline)
    return _join(payload, rank, world_size, addr, port, deadline)


# ------------------------------------------------------------------------------ rank 0
def _raise_file_limit(world_size: int) -> None:
    need = world_size + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise GatherError(f"rank 0: {world_size} ranks need {need} open files, and this process "
                          f"may open at most {hard} (ulimit -Hn): raise the hard limit of open "
                          "files for the job (e.g. in the Slurm node's limits.conf)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _serve(payload: bytes, world_size: int, port: int, deadline: float) -> list:
    _raise_file_limit(world_size)
    srv = socket.create_server(("", port), family=socket.AF_INET, backlog=min(world_size, 4096),
                               reuse_port=False)
    srv.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    got: dict[int, bytes] = {0: payload}
    conns: dict[socket.socket, bytearray] = {}
    done: list[socket.socket] = []      # connections whose payload arrived: each gets the answer
    try:
        while len(got) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GatherError(_missing(got, world_size, "did not join the pre-flight"))
            for key, _ in sel.select(timeout=min(left, 1.0)):
                sock = key.fileobj
                if sock is srv:
                    _accept(srv, sel, conns)
                    continue
                _read(sock, sel, conns, done, got, world_size)
        answer = zlib.compress(pickle.dumps([pickle.loads(got[r]) for r in range(world_size)]), 1)
        for sock in done:
            sock.setblocking(True)
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            try:
                sock.sendall(_LENGTH.pack(len(answer)) + answer)
            except OSError:
                pass            # that rank is gone: it fails on its own, the others go on
        return pickle.loads(zlib.decompress(answer))
    finally:
        for sock in list(conns):
            sock.close()
        sel.close()
        srv.close()


def _accept(srv: socket.socket, sel, conns: dict) -> None:
    while True:
        try:
            sock, _ = srv.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        conns[sock] = bytearray()
        sel.register(sock, selectors.EVENT_READ)


def _read(sock, sel, conns: dict, done: list, got: dict, world_size: int) -> None:
    buf = conns[sock]
    try:
        chunk = sock.recv(65536)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        chunk = b""
    if not chunk:               # closed before its payload: a rank that died, or a stray client
        sel.unregister(sock)
        del conns[sock]
        sock.close()
        return
    buf += chunk
    if len(buf) < _HEADER.size:
        return
    magic, rank, world, size = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        sel.unregister(sock)
        del conns[sock]
        sock.close()            # not a pre-flight rank: ignore it
        return
    if world != world_size:
        raise GatherError(f"rank {rank} reports a world of {world} ranks, rank 0 one of "
                          f"{world_size}: the ranks were launched with different job sizes")
    if not 0 < rank < world_size or rank in got:
        raise GatherError(f"rank {rank} joined twice or is out of range (world {world_size}): "
                          "two launches share this port (MASTER_PORT)")
    if size > MAX_PAYLOAD:
        raise GatherError(f"rank {rank}: payload of {size} bytes > {MAX_PAYLOAD}")
    if len(buf) >= _HEADER.size + size:
        got[rank] = bytes(buf[_HEADER.size:_HEADER.size + size])
        done.append(sock)
        sel.unregister(sock)


def _missing(got: dict, world_size: int, what: str) -> str:
    missing = [r for r in range(world_size) if r not in got]
    shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
    return (f"{len(missing)} of {world_size} ranks {what} before the timeout (ranks {shown}): "
            "a node that never started its tasks, a container that failed to start, or a rank "
            "that died at import (its own output says which)")


# ------------------------------------------------------------------------------ other ranks
def _join(payload: bytes, rank: int, world_size: int, addr: str, port: int,
          deadline: float) -> list:
    message = _HEADER.pack(MAGIC, rank, world_size, len(payload)) + payload
    sock = _connect(rank, addr, port, deadline)
    try:
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        sock.sendall(message)
        head = _recv_exact(sock, _LENGTH.size, rank, addr, port)
        answer = _recv_exact(sock, _LENGTH.unpack(head)[0], rank, addr, port)
    except socket.timeout:
        raise GatherError(f"rank {rank}: no answer from rank 0 ({addr}:{port}) before the "
                          "timeout: some ranks did not join (rank 0 lists them)",
                          from_rank0=True) from None
    finally:
        sock.close()
    return pickle.loads(zlib.decompress(answer))


def _connect(rank: int, addr: str, port: int, deadline: float) -> socket.socket:
    """Connect to rank 0, retrying while it has not started listening (or its backlog is full)."""
    delay, last = 0.05, None
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((addr, port), timeout=max(
                1.0, min(30.0, deadline - time.monotonic())))
        except OSError as e:
            last = e
            time.sleep(min(delay * (1 + random.random()), max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 2.0)
    raise GatherError(f"rank {rank}: could not reach rank 0 at {addr}:{port} before the timeout "
                      f"({last}): is rank 0 running, and is MASTER_ADDR its address?")


def _recv_exact(sock: socket.socket, n: int, rank: int, addr: str, port: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise GatherError(f"rank {rank}: rank 0 ({addr}:{port}) closed the connection before "
                              "answering: it failed (its output says why)", from_rank0=True)
        buf += chunk
    return bytes(buf)
