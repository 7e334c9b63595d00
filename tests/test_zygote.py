"""The rank launcher of the multi-process tests (tests/helpers/zygote.py): the environment
torchrun gives a rank, ranks forked from the preloaded zygote, one intra-op thread, and a
failing or hanging rank reported, never waited on forever."""
import json
import os

import pytest

from helpers import zygote, zygote_probe

PROBE = zygote.REPO / "tests" / "helpers" / "zygote_probe.py"


def test_ranks_get_torchruns_environment_from_the_preloaded_zygote(tmp_path, monkeypatch):
    monkeypatch.setenv("ZYGOTE_PROBE", "seen")          # the caller's environment at the call
    r = zygote.spawn(zygote_probe.report, (str(tmp_path),), 3, cwd=tmp_path, check=True)
    got = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(3)]
    port = got[0]["env"]["MASTER_PORT"]
    for i, g in enumerate(got):
        assert g["env"] == {"RANK": str(i), "WORLD_SIZE": "3", "LOCAL_RANK": str(i),
                            "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": port, "OMP_NUM_THREADS": "1", "ZYGOTE_PROBE": "seen"}
        assert g["sum"] == 3.0 and g["cwd"] == str(tmp_path) and g["threads"] == 1
        assert g["ppid"] != os.getpid()                  # forked by the zygote, not by pytest
        assert g["pristine"] == {"cpu_compat_applied": False, "process_group": False}
    assert [rk.missing_preload for rk in r.ranks] == [[]] * 3
    assert r.stdout == "".join(f"rank {i} says hello\n" for i in range(3))


def test_a_script_entry_gets_its_argv_and_its_exit_status():
    ok = zygote.run_script(PROBE, ["0", "x"])
    assert ok.returncode == 0 and ok.stdout == '["0", "x"]\n'
    bad = zygote.run_script(PROBE, ["3"])
    assert bad.returncode == 3 and "rank 0 failed first (exit status 3)" in bad.stderr


def test_a_failing_rank_is_reported_and_the_others_killed():
    r = zygote.spawn(zygote_probe.fail_on_one, (), 3, timeout=300)
    assert r.returncode == 1
    tail = r.stderr[-4000:]
    assert "ValueError: boom on rank 1" in tail and "rank 1 about to fail" in tail
    # the first failure's traceback last; the others failed with it (gloo saw the peer go) or
    # were killed GRACE_S after it
    assert "rank 1 failed first (exit status 1)" in tail.strip().splitlines()[-1]
    with pytest.raises(AssertionError, match="boom on rank 1"):
        zygote.spawn(zygote_probe.fail_on_one, (), 2, timeout=300, check=True)


def test_the_first_failure_is_the_earliest_not_the_first_exit():
    """A rank whose process outlives its failure (a slow teardown) is still the one that failed
    first: `make test` in a fresh clone once read "rank 2 failed first" where rank 2 had only
    seen rank 1's sockets close and exited before rank 1's process ended."""
    r = zygote.spawn(zygote_probe.fail_first_exit_last, (), 3, timeout=60)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "rank 1 failed first (exit status 1)" in last, last
    assert "also failed: [(2, 'exit status 1')]" in last
    assert "first failure, on rank 1" in r.stderr and "second failure, on rank 2" in r.stderr


def test_a_hanging_rank_is_killed_at_the_timeout():
    r = zygote.spawn(zygote_probe.hang, (), 2, timeout=5)
    assert r.returncode == 124 and "timed out after 5 s: ranks [0] still running" in r.stderr
    assert r.ranks[0].exitcode is None and r.ranks[1].exitcode == 0
