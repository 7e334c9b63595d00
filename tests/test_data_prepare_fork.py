"""data prepare forks its tokenizer workers only from a single-threaded process.

A fork copies the locks that the process's other threads hold at that moment, held forever in the
child. Under `make coverage` a tokenizer worker forked from a pytest worker (whose earlier tests
left gloo's threads running) hung in coverage.py's after-fork hook, and with it `make test` (2026-12-05).
With more than one thread, the pool spawns its workers instead (fresh interpreters; not the
forkserver, of which a process has one: started here, it would lack the modules that
tests/helpers/zygote.py later asks it to preload); they load the tokenizer themselves
(unit._tokenizer). The output is the same bytes either way."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from data_helpers import make_tokenizer, texts, write_shard
from llama31_405b.data import prepare as prepare_mod
from llama31_405b.data import unit as unit_mod
from llama31_405b.data.prepare import Output, prepare


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("fork")
    docs = texts()
    tok = make_tokenizer(root / "tok.model", docs)
    shards = tuple(write_shard(root / f"raw/s{i}.json.gz", docs[i::2]) for i in range(2))
    return tok, shards


def _methods(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = prepare_mod.ProcessPoolExecutor

    class Recording(real):     # the real pool, its start method recorded
        def __init__(self, *args, mp_context=None, **kwargs):
            seen.append(mp_context.get_start_method())
            super().__init__(*args, mp_context=mp_context, **kwargs)

    monkeypatch.setattr(prepare_mod, "ProcessPoolExecutor", Recording)
    monkeypatch.setattr(unit_mod, "BLOCK_BYTES", 2000, raising=False)   # several blocks a shard
    return seen


def _tasks() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


def test_with_another_thread_the_workers_are_spawned(corpus, tmp_path, monkeypatch):
    tok, shards = corpus
    seen = _methods(monkeypatch)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert _tasks() > 1
        out = Output(prefix=tmp_path / "a" / "t_text_document", inputs=shards)
        [res] = prepare([out], tok, data_dir=out.prefix.parent, workers=2, progress=False)
    finally:
        stop.set()
        other.join()
    assert seen == ["spawn"] and res.status == "prepared" and res.documents > 0, (seen, res)
    one = Output(prefix=tmp_path / "b" / "t_text_document", inputs=shards)
    prepare([one], tok, data_dir=one.prefix.parent, workers=1, progress=False)
    for ext in (".bin", ".idx"):
        assert Path(f"{out.prefix}{ext}").read_bytes() == Path(f"{one.prefix}{ext}").read_bytes()
    assert json.loads((out.prefix.parent / "manifest.json").read_text())
