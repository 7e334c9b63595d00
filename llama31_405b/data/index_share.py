"""The .idx arrays a training read needs, one read-only copy per node in shared memory.

What a sample reads of an .idx: megatron-core 0.19.2's `GPTDataset.__getitem__` asks its
`IndexedDataset.get(doc, offset, length)` for each document piece, which reads
`_IndexReader.__getitem__`: `sequence_pointers[doc]` and `sequence_lengths[doc]` (and
`sequence_modes[doc]`, multimodal data only). `document_indices` is read only while the dataset
is built (`IndexedDataset.__init__` checks its last entry; megatron-core's GPT and blended datasets
never read it afterwards), and the whole `sequence_lengths` only by the rank that builds the
document/sample/shuffle indices (`GPTDataset._build_document_sample_shuffle_indices`; the others
load them from the cache). megatron-core keeps those arrays as views of a map of the .idx
(`numpy.frombuffer` over `_IndexReader.bin_buffer_mmap`).

Why not read them through that map: a mapped file that shrinks under the process turns the next
access to a vanished page into SIGBUS, which kills the process inside NumPy before any Python code
can name the file (data/binfile.py). The .idx lives on the shared file system, where anyone with
write access (another job re-preparing the data, a `cp` over it, which truncates in place) can
shrink it at any moment; checking its stat before each access narrows that window but cannot
close it: the truncation can land between the check and the access. Until issue 44 every rank
copied the four arrays into private memory instead (20 bytes per C4 document, one sequence
each: about 0.9 GB per C4 shard per rank, 7.3 GB per 4-GPU node).

What this module does instead, when the datasets are built (before run_start):
1. The job draws one token per launch (global rank 0, broadcast with torch.distributed), so the
   shared files of this launch have names no other launch uses: a file left by a dead job is never
   taken for this one's.
2. On each node, one process copies what a read needs (`sequence_pointers`, `sequence_lengths`,
   `sequence_modes` when present: 12 bytes per sequence, 13 multimodal) from the .idx, with pread
   (a shrink during the copy is a short read, a DataError naming the file, never SIGBUS), into a
   file in node-local shared memory (`SHM_DIR`, tmpfs), named after the token and the .idx's
   path and stamp. The process is elected by the file system: the first to create
   `NAME.part` with O_EXCL copies; the others wait (up to `WAIT_S`) for `NAME`, which the copier
   links into place only once complete and read-only (mode 0400), so no one sees a partial file.
   The .idx's stat is compared with the run's stamp of it before and after the copy.
3. Every process of the node maps `NAME` read-only and takes its arrays as views of that map;
   megatron-core's map of the .idx is closed.
4. After a barrier of the whole job (every process has mapped its node's copies), the copier
   unlinks `NAME`. Without torch.distributed (one process, or datasets built before the process
   group exists) each process draws its own token and makes and unlinks its own copy.

Why a job-owned tmpfs file closes the SIGBUS window: SIGBUS comes from an access within the
mapped length to a page beyond the file's current end, so only a file that shrinks after it was
mapped can raise it. Shrinking needs a writable descriptor (ftruncate) or a name (truncate,
open with O_TRUNC). The copy has neither once step 4 is done: no name (unlinked), no descriptor
left open (each process closed its own after mapping), and its processes map it read-only; the
tmpfs pages live until the last mapping goes (at exit, crash or SIGKILL included: nothing to clean
up). Between its link (step 2) and its unlink (step 4), at init until every node's copy is
mapped (seconds; at scale, as long as the slowest node's copy), it has a name with mode 0400
owned by the job's user: only that user (after a chmod) or root could truncate it,
and deliberately. A name left by a job that died in that window carries the dead launch's token:
never reused; an epilog may remove `SHM_DIR/llama31_405b-idx-*` when no job runs.

The source files keep their protection: each .bin is read with pread and its stat checked
(data/binfile.py), and each .idx's stat is checked at the same interval by the same reader, so a
.bin or .idx changed under the run ends it with a DataError naming the file.

Cost per node (`node_footprint`, printed by the rehearsal): the copy is read from the data file
system once per node instead of the whole .idx (megatron's page cache shared what the ranks
copied, so the whole file was read once per node before too), and held once per node instead of
once per process. Where `SHM_DIR` is missing or not writable, each process reads the same arrays
into private memory (through the node's page cache; held per process).
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import stat
import struct
import time
import uuid
from dataclasses import dataclass

import numpy as np

from .binfile import FileStamp, changed_error
from .errors import DataError

SHM_DIR = "/dev/shm"
NAME_PREFIX = "llama31_405b-idx-"
WAIT_S = 900.0
"""How long a process waits for its node's copy: the benchmark's two shards make a 1.1 GB copy
per node, 2.2 TB for 2,048 nodes copying at once: 900 s leaves the data file system 2.5 GB/s in
aggregate. (The barrier of `release` then waits within the process group's timeout, as
megatron-core's builder does while rank 0 builds the index caches.)"""
IDX_HEADER = 34
"""megatron-core's .idx header: magic (9), version (8), dtype code (1), sequence count (8),
document-index count (8) (`_IndexWriter.write`)."""
_HEAD = struct.Struct("<8sqqQQQQ")   # magic, size, mtime_ns, ino, dev, sequences, modes
_MAGIC = b"L405IDX1"
HEAD_BYTES = 64
_CHUNK = 64 << 20


def copy_bytes(sequences: int, multimodal: bool = False) -> int:
    """Bytes of one shared copy: header, int64 pointers, int32 lengths (and int8 modes)."""
    return HEAD_BYTES + sequences * (12 + multimodal)


def idx_bytes(sequences: int, document_entries: int, multimodal: bool = False) -> int:
    """Bytes of an .idx (megatron-core's layout; `document_entries` = documents + 1)."""
    return IDX_HEADER + sequences * (12 + multimodal) + 8 * document_entries


@dataclass(frozen=True)
class SharedIndex:
    """One .idx's arrays in this process: `mapping` is the read-only map they are views of (None:
    a private copy), `path` the shared file's name (unlinked by `release`)."""
    idx_path: str
    path: str | None
    created: bool
    mapping: mmap.mmap | None
    ino: int = 0
    """The shared file's inode (0: a private copy): equal in the processes of a node."""


def _world():
    """torch.distributed when initialised with more than one process, else None."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def launch_token() -> str:
    """A token drawn per launch by global rank 0, the same in every process of the job."""
    token = uuid.uuid4().hex[:16]
    dist = _world()
    if dist is not None:
        box = [token]
        dist.broadcast_object_list(box, src=0)
        token = box[0]
    return token


def shared_name(shm_dir: str, token: str, idx_path: str, stamp: FileStamp) -> str:
    key = f"{os.path.realpath(idx_path)}\0{stamp.size}\0{stamp.mtime_ns}\0{stamp.ino}\0{stamp.dev}"
    return os.path.join(shm_dir, f"{NAME_PREFIX}{token}-"
                                 f"{hashlib.sha256(key.encode()).hexdigest()[:20]}")


def _check_source(idx_path: str, stamp: FileStamp, fd: int | None = None) -> None:
    st = os.fstat(fd) if fd is not None else os.stat(idx_path)
    now = FileStamp(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino, dev=st.st_dev)
    what = stamp.differences(now)
    if what:
        raise changed_error(idx_path, what, "the datasets were built")


def _fill(idx_path: str, stamp: FileStamp, sequences: int, document_entries: int,
          multimodal: bool, write, drop_cache: bool = True) -> None:
    """Copy the read-time arrays of the .idx into the copy's layout through `write(offset,
    bytes)`, with pread; the .idx must match `stamp` before and after."""
    n = sequences
    parts = [(IDX_HEADER + 4 * n, HEAD_BYTES, 8 * n),                # pointers
             (IDX_HEADER, HEAD_BYTES + 8 * n, 4 * n)]                 # lengths
    if multimodal:
        parts.append((IDX_HEADER + 12 * n + 8 * document_entries, HEAD_BYTES + 12 * n, n))
    try:
        src = os.open(idx_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise DataError(f"{idx_path}: cannot be read any more ({e.strerror}) since the datasets "
                        "were built; restore it and start a new run") from None
    try:
        _check_source(idx_path, stamp, src)
        write(0, _HEAD.pack(_MAGIC, stamp.size, stamp.mtime_ns, stamp.ino, stamp.dev, n,
                            int(multimodal)).ljust(HEAD_BYTES, b"\0"))
        for src_at, dst_at, count in parts:
            done = 0
            while done < count:
                data = os.pread(src, min(_CHUNK, count - done), src_at + done)
                if not data:
                    raise DataError(f"{idx_path}: ends at byte {src_at + done}, its header says "
                                    f"{idx_bytes(n, document_entries, multimodal)} bytes: it "
                                    "shrank under the running job since the datasets were "
                                    "built; restore it and start a new run")
                write(dst_at + done, data)
                done += len(data)
        _check_source(idx_path, stamp, src)
        if drop_cache and hasattr(os, "posix_fadvise"):   # the copy stays in memory, not the cache
            os.posix_fadvise(src, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(src)


def _create(name: str, part_fd: int, idx_path: str, stamp: FileStamp, sequences: int,
            document_entries: int, multimodal: bool) -> bool:
    """Fill `part_fd` (this process's `name`.part) and link it as `name`: True where this process
    made `name`, False where another process of the launch linked it first (it made its copy
    after this one found no `name` and before this one's .part existed: only the maker unlinks
    the name, `release`)."""
    part = name + ".part"
    try:
        size = copy_bytes(sequences, multimodal)
        try:
            os.posix_fallocate(part_fd, 0, size)   # tmpfs full: ENOSPC now, not at a write
            _fill(idx_path, stamp, sequences, document_entries, multimodal,
                  lambda at, data: os.pwrite(part_fd, data, at))
            os.fchmod(part_fd, stat.S_IRUSR)
            os.link(part, name)
        except FileExistsError:
            return False   # another process of this launch on this node made the same copy
        except OSError as e:
            raise DataError(f"{os.path.dirname(name)}: cannot hold the {size:,}-byte copy of "
                            f"{idx_path}'s read-time arrays ({e.strerror}): give the node's "
                            "shared memory that much room (a container: --shm-size or "
                            "--ipc=host)") from None
    finally:
        os.close(part_fd)
        try:
            os.unlink(part)
        except FileNotFoundError:
            pass
    return True


def _wait(name: str, idx_path: str) -> None:
    part, deadline = name + ".part", time.monotonic() + WAIT_S
    while not os.path.exists(name):
        if not os.path.exists(part) and not os.path.exists(name):   # `name` is linked first
            raise DataError(f"{name}: the copy of {idx_path}'s read-time arrays by another "
                            "process of this job on this node failed (its error names the "
                            "cause)")
        if time.monotonic() > deadline:
            raise DataError(f"{name}: the copy of {idx_path}'s read-time arrays by another "
                            f"process of this job on this node was not done in {WAIT_S:.0f} s")
        time.sleep(0.02)


def _map(name: str, idx_path: str, stamp: FileStamp, sequences: int,
         multimodal: bool) -> tuple[mmap.mmap, int]:
    size = copy_bytes(sequences, multimodal)
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_mode & 0o222 or st.st_uid != os.geteuid()
                or st.st_size != size):
            raise DataError(f"{name}: not the read-only {size:,}-byte copy of {idx_path} this "
                            f"job made (mode {stat.filemode(st.st_mode)}, owner {st.st_uid}, "
                            f"{st.st_size:,} bytes); remove it and start a new run")
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    head = _HEAD.unpack_from(m, 0)
    if head != (_MAGIC, stamp.size, stamp.mtime_ns, stamp.ino, stamp.dev, sequences,
                int(multimodal)):
        m.close()
        raise DataError(f"{name}: holds the arrays of another {idx_path} than this process "
                        "built its datasets from (the .idx changed while the job started); "
                        "restore it and start a new run")
    return m, st.st_ino


def _usable(shm_dir: str) -> bool:
    return os.path.isdir(shm_dir) and os.access(shm_dir, os.W_OK | os.X_OK)


def _private(idx_path: str, stamp: FileStamp, sequences: int, document_entries: int,
             multimodal: bool) -> bytearray:
    buf = bytearray(copy_bytes(sequences, multimodal))

    def write(at: int, data: bytes) -> None:
        buf[at:at + len(data)] = data
    _fill(idx_path, stamp, sequences, document_entries, multimodal, write, drop_cache=False)
    return buf


def _use(index, buf, sequences: int, multimodal: bool) -> None:
    """Point megatron-core's `_IndexReader` at the copy and close its map of the .idx."""
    n = sequences
    arrays = {"sequence_pointers": np.frombuffer(buf, np.int64, n, HEAD_BYTES),
              "sequence_lengths": np.frombuffer(buf, np.int32, n, HEAD_BYTES + 8 * n),
              "sequence_modes": (np.frombuffer(buf, np.int8, n, HEAD_BYTES + 12 * n)
                                 if multimodal else None),
              "document_indices": None}   # not read after the build (module docstring)
    for name, a in arrays.items():
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
        setattr(index, name, a)
    view, mapped = getattr(index, "bin_buffer", None), getattr(index, "bin_buffer_mmap", None)
    if mapped is None:
        return
    del index.bin_buffer, index.bin_buffer_mmap
    raw = mapped._mmap
    if view is not None:
        view.release()
    del mapped
    try:
        raw.close()
    except BufferError:   # a view of it held elsewhere: left open, no read of the run uses it
        pass


def share(indexed: list, stamps: dict[str, FileStamp], *,
          shm_dir: str = SHM_DIR) -> list[SharedIndex]:
    """Give each megatron-core IndexedDataset of `indexed` (every process of the job calls this,
    with the same datasets: it has collectives) the read-time arrays of its .idx from its node's
    shared copy; `stamps[idx path]` is the .idx's stat when the datasets were built. Returns
    what `release` needs."""
    from megatron.core.datasets.indexed_dataset import get_idx_path
    token = launch_token()
    usable = _usable(shm_dir)
    out: list[SharedIndex] = []
    for ix in indexed:
        idx_path = get_idx_path(ix.path_prefix)
        stamp = stamps.get(idx_path) or FileStamp.of(idx_path)
        _check_source(idx_path, stamp)
        index = ix.index
        n, d, multimodal = index.sequence_count, index.document_count, bool(ix.multimodal)
        if not usable:
            _use(index, _private(idx_path, stamp, n, d, multimodal), n, multimodal)
            out.append(SharedIndex(idx_path, None, False, None))
            continue
        name = shared_name(shm_dir, token, idx_path, stamp)
        created = False
        if not os.path.exists(name):
            try:
                fd = os.open(name + ".part", os.O_RDWR | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_CLOEXEC", 0), 0o600)
            except FileExistsError:
                _wait(name, idx_path)
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EROFS, errno.ENOSPC):
                    raise
                raise DataError(f"{shm_dir}: cannot create the copy of {idx_path}'s read-time "
                                f"arrays ({e.strerror})") from None
            else:
                created = _create(name, fd, idx_path, stamp, n, d, multimodal)
        m, ino = _map(name, idx_path, stamp, n, multimodal)
        _use(index, m, n, multimodal)
        out.append(SharedIndex(idx_path, name, created, m, ino))
    return out


def release(shared: list[SharedIndex]) -> None:
    """After every process of the job has mapped its node's copies (a barrier of the job), the
    processes that made them unlink their names: the memory stays until the last map goes."""
    dist = _world()
    if dist is not None:
        dist.barrier()
    for s in shared:
        if s.created and s.path:
            try:
                os.unlink(s.path)
            except FileNotFoundError:
                pass


@dataclass(frozen=True)
class NodeFootprint:
    """The training .idx files at init, per node of `ranks_per_node` processes."""
    ranks_per_node: int
    idx_bytes: int
    """The whole .idx files: before, every rank copied their arrays into private memory, and the
    node's page cache read each file once."""
    arrays_bytes: int
    """What every rank held before: the .idx files less their headers."""
    copy_bytes: int
    """The shared copies: read from the data file system once per node, held once per node."""

    def as_dict(self) -> dict:
        return {"ranks_per_node": self.ranks_per_node, "idx_bytes": self.idx_bytes,
                "read_bytes": self.copy_bytes, "memory_bytes": self.copy_bytes,
                "read_before_bytes": self.idx_bytes,
                "memory_before_bytes": self.ranks_per_node * self.arrays_bytes}


def node_footprint(shards: list[tuple[int, int]], ranks_per_node: int) -> NodeFootprint:
    """Per node, for the training shards' (sequences, document-index entries)."""
    whole = sum(idx_bytes(n, d) for n, d in shards)
    return NodeFootprint(ranks_per_node, whole, whole - IDX_HEADER * len(shards),
                         sum(copy_bytes(n) for n, _ in shards))
