"""The batch loader thread (train.prefetch): same batches in the same order as the synchronous
read, prepared ahead of the step that needs them, stopped cleanly, errors raised in the loop."""
import threading

import pytest
import torch

from llama31_405b.train.batches import train_microbatches
from llama31_405b.train.prefetch import Prefetcher


class _Dataset:
    def __init__(self, n=64, seq=8):
        g = torch.Generator().manual_seed(0)
        self.items = [{"tokens": torch.randint(0, 100, (seq,), generator=g),
                       "labels": torch.randint(0, 100, (seq,), generator=g),
                       "loss_mask": torch.ones(seq), "position_ids": torch.arange(seq)}
                      for _ in range(n)]
        self.threads = set()

    def __getitem__(self, i):
        self.threads.add(threading.current_thread().name)
        return self.items[i]


def _read(ds, k):
    return train_microbatches(ds, step=k, gbs=8, minibs=4, mbs=2, dp_rank=1)


def test_prefetched_batches_equal_the_synchronous_ones_in_order():
    ds = _Dataset()
    loader = Prefetcher(lambda k: _read(ds, k), start=0, stop=6)
    try:
        for k in range(6):
            got, want = loader.get(k), _read(_Dataset(), k)
            assert len(got) == len(want) == 2
            for a, b in zip(got, want):
                assert all(torch.equal(a[key], b[key]) for key in b)
    finally:
        loader.close()
    assert "batch-prefetch" in ds.threads and threading.current_thread().name not in ds.threads
    other = Prefetcher(lambda k: k, start=0, stop=6)
    try:
        with pytest.raises(RuntimeError, match="step 3 asked for, step 0 is next"):
            other.get(3)
    finally:
        other.close()


def test_the_next_step_is_read_before_the_loop_asks_for_it():
    asked = {k: threading.Event() for k in range(4)}

    def make(k):
        asked[k].set()
        return k

    loader = Prefetcher(make, start=0, stop=4, depth=2)
    try:
        assert loader.get(0) == 0
        # step 1 (and 2) are read while the loop is still busy with step 0
        assert asked[1].wait(10) and asked[2].wait(10)
        assert loader.get(1) == 1
    finally:
        loader.close()


def test_close_stops_a_loader_blocked_on_a_full_queue():
    started = threading.Event()

    def make(k):
        if k == 1:
            started.set()
        return k

    loader = Prefetcher(make, start=0, stop=10_000, depth=1)
    assert started.wait(10)          # step 0 queued, step 1 read and waiting for room
    loader.close(timeout_s=10)
    assert not loader.alive
    # nothing it prepared stays held (a GPU batch pinned until the process ends): the thread
    # gave up its put of step 1 instead of putting it into the room the close made
    assert loader._queue.qsize() == 0


def test_a_loader_that_ended_without_the_step_is_named():
    loader = Prefetcher(lambda k: k, start=0, stop=0)     # nothing to read: the thread ends
    try:
        with pytest.raises(RuntimeError, match="the loader thread ended before step 0"):
            loader.get(0)
    finally:
        loader.close()


def test_a_read_error_is_raised_at_the_step_that_needs_it():
    def make(k):
        if k == 2:
            raise OSError("disk gone")
        return k

    loader = Prefetcher(make, start=0, stop=5)
    try:
        assert loader.get(0) == 0 and loader.get(1) == 1
        with pytest.raises(RuntimeError, match="batch of step 2 failed: disk gone"):
            loader.get(2)
    finally:
        loader.close()
