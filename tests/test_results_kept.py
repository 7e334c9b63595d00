"""run_and_time.sh never loses a result and checks its folders before it starts anything that
costs: a LOGDIR holding an earlier campaign's files is refused (they stay byte for byte), two
campaigns given one LOGDIR at once are not both let in (the lock names its holder), and a LOGDIR
or data folder that cannot be used stops the job with exit 2 and one line naming the variable.
The design: docs/launch.md, "Folders and results". No run trains here: each job stops at the
check under test, or prints its commands (DRY_RUN)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = "configs/tiny_cpu.toml"
PUBLISHED = REPO / "tests/fixtures/mlperf_v5.1_llama31_405b_uf_b200_n32"
PREFIX = "run_and_time.sh: "


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "CONT", "NEXP", "DATADIR", "CKPTDIR"))}
    env.update(PYTHONPATH=str(REPO), PYTHON=sys.executable, CLEAR_CACHES="0", CONFIG=CONFIG,
               NEXP="1")
    env.update(extra)
    return env


def _script(env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "run_and_time.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, **kw)


def _error_line(p: subprocess.CompletedProcess) -> str:
    """The script's one line on stderr (exit 2)."""
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), p.stderr
    return lines[0][len(PREFIX):]


def test_a_converged_result_survives_a_second_campaign(tmp_path):
    """A published converged result in LOGDIR: a second campaign there (a real start and a
    DRY_RUN alike) is refused naming the file, which stays byte for byte."""
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(PUBLISHED / "result_0.txt", logs / "result_0.txt")
    (logs / "console_0.txt").write_text("the first campaign's console\n")
    before = {p.name: p.read_bytes() for p in logs.iterdir()}
    for extra in ({}, {"DRY_RUN": "1"}):
        line = _error_line(_script(_env(LOGDIR=str(logs), **extra)))
        assert line == (f"LOGDIR={logs} already holds an earlier campaign's files (console_0.txt "
                        "result_0.txt), kept: a result is never replaced; choose a new LOGDIR "
                        "(unset: a fresh runs/<config>-<job id>), or move those files away first")
        assert {p.name: p.read_bytes() for p in logs.iterdir()
                if p.name != ".run_and_time.lock"} == before


def _waiting_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter for the script that waits at `launch env` until a file appears, so a
    campaign holds its LOGDIR as long as the test wants; (wrapper, the file to create)."""
    go = tmp_path / "go"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/usr/bin/env bash\n"
                       f'if [ "$3 $4" = "launch env" ]; then\n'
                       f'  while [ ! -e {go} ]; do sleep 0.1; done\nfi\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, go


def _wait_for_lock(lock: Path, pid: int, first: subprocess.Popen) -> None:
    t0 = time.monotonic()
    while f"pid {pid}," not in (lock.read_text() if lock.exists() else ""):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() - t0 < 60, "the first campaign did not take the lock"
        time.sleep(0.1)


def _holding_campaign(tmp_path: Path) -> tuple[subprocess.Popen, Path, dict]:
    """A DRY_RUN campaign (its own session) holding the lock of tmp_path/logs until the
    returned file is created; (the process, that file, the env for a second campaign)."""
    logs = tmp_path / "logs"
    wrapper, go = _waiting_python(tmp_path)
    env = _env(LOGDIR=str(logs), DRY_RUN="1")
    first = subprocess.Popen(["bash", str(REPO / "run_and_time.sh")], cwd=REPO,
                             env=dict(env, PYTHON=str(wrapper)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_lock(logs / ".run_and_time.lock", first.pid, first)
    return first, go, env


def test_two_campaigns_in_one_logdir_at_once(tmp_path):
    """The second is refused naming the first (its pid, host); once the first has ended, the
    folder is free again."""
    logs = tmp_path / "logs"
    first, go, env = _holding_campaign(tmp_path)
    try:
        line = _error_line(_script(env))
        assert line.startswith(f"LOGDIR={logs}: in use by another run_and_time.sh (job none "
                               f"(local), host {os.uname().nodename}, pid {first.pid}, since ")
        assert line.endswith(" UTC); wait for it to end, or choose another LOGDIR")
    finally:
        go.touch()
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    p = _script(env)
    assert p.returncode == 0, p.stderr


def test_a_killed_campaign_leaves_no_lock(tmp_path):
    """A campaign killed with SIGKILL (with every process it started): the lock dies with it."""
    first, _, env = _holding_campaign(tmp_path)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    # every process of the group gone, not only its leader: a child still exiting holds the
    # lock's descriptor for a moment (seen once under make test's load)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(first.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    p = _script(env)
    assert p.returncode == 0, p.stderr


def test_a_logdir_that_cannot_be_used_stops_the_job_first(tmp_path):
    """A file, a path under a file: one line, exit 2, before the config's plan is even made."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _error_line(_script(_env(LOGDIR=str(blocker)))) == (
        f"LOGDIR={blocker}: not a directory (a file is in the way); choose another LOGDIR")
    assert _error_line(_script(_env(LOGDIR=str(blocker / "sub")))) == (
        f"LOGDIR={blocker}/sub: cannot be created (not a directory); choose another LOGDIR")


def _in_mount_namespace(tmp_path: Path, setup: str, env: dict) -> subprocess.CompletedProcess:
    """The script in a private mount namespace after `setup` (mount commands): read-only and
    full filesystems without touching this machine's mounts."""
    # CI runs as root, where this always works: there a missing namespace fails, never skips
    give_up = pytest.fail if os.environ.get("CI") else pytest.skip
    if shutil.which("unshare") is None:
        give_up("no unshare here")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        give_up("no mount namespaces here (needs root and CAP_SYS_ADMIN)")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                           f"set -e; {setup}; exec bash {REPO / 'run_and_time.sh'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_read_only_or_full_logdir_stops_the_job_first(tmp_path):
    ro, small = tmp_path / "ro", tmp_path / "small"
    ro.mkdir()
    small.mkdir()
    setup = (f"mount --bind {ro} {ro}; mount -o remount,bind,ro {ro}; "
             f"mount -t tmpfs -o size=1m tmpfs {small}")
    p = _in_mount_namespace(tmp_path, setup, _env(LOGDIR=str(ro)))
    assert _error_line(p) == (f"LOGDIR={ro}: not writable (read-only file system); choose "
                              "another LOGDIR")
    p = _in_mount_namespace(tmp_path, setup, _env(LOGDIR=str(ro / "sub")))
    assert _error_line(p) == (f"LOGDIR={ro}/sub: cannot be created (read-only file system); "
                              "choose another LOGDIR")
    p = _in_mount_namespace(tmp_path, setup, _env(LOGDIR=str(small)))
    assert _error_line(p) == (f"LOGDIR={small}: 1 MB free, the runs' logs need 64 MB; free some "
                              "space or choose another LOGDIR")


def test_data_and_checkpoint_folders_are_checked_before_any_step(tmp_path):
    """DATADIR, the config's data.tokenizer under it, CKPTDIR: one line each, exit 2, before the
    data verification (the first step)."""
    data, ckpt, logs = tmp_path / "data", tmp_path / "ckpt", tmp_path / "logs"
    env = _env(LOGDIR=str(logs), DATADIR=str(data), CKPTDIR=str(ckpt))
    assert _error_line(_script(env)) == (f"DATADIR={data}: no such directory; set DATADIR (or "
                                         "data.data_dir) to the dataset's folder (docs/data.md)")
    data.mkdir()
    tok = data / "tokenizer" / "tiny_sp.model"
    assert _error_line(_script(env)) == (
        f"data.tokenizer=tokenizer/tiny_sp.model under DATADIR={data}: {tok} not found; put the "
        "tokenizer there, or set data.tokenizer to its path under the data folder")
    tok.parent.mkdir()
    tok.write_bytes(b"x")
    assert _error_line(_script(env)) == (
        f"CKPTDIR={ckpt}: no such directory; set CKPTDIR (or checkpoint.ckpt_dir) to the folder "
        "of the initial checkpoint (docs/checkpoint.md)")
    # without the variables, the config keys are named
    p = _script(_env(LOGDIR=str(logs), CONFIG=str(_config(tmp_path, data / "none"))))
    assert _error_line(p).startswith(f"data.data_dir={data / 'none'}: no such directory; ")
    assert not list(logs.glob("result_*.txt")) and not list(logs.glob("console_*.txt"))


def _config(tmp_path: Path, data_dir: Path) -> Path:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(f'base = "{REPO / CONFIG}"\n[data]\ndata_dir = "{data_dir}"\n')
    return cfg


def test_check_log_on_a_full_disk_names_the_folder(tmp_path):
    """`launch check-log --report-dir` on a full filesystem: the folder and the cause, exit 1."""
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("no mount namespaces here (needs root and CAP_SYS_ADMIN)")
    log = PUBLISHED / "result_0.txt"
    cmd = (f"mount -t tmpfs -o size=64k tmpfs {full} && "
           f"dd if=/dev/zero of={full}/fill bs=4k count=100 2>/dev/null; "
           f"exec {sys.executable} -m llama31_405b launch check-log --config "
           f"configs/config_GB200_2048x4x8xtp4pp8cp2.toml --report-dir {full} {log}")
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", cmd],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        f"error: launch check-log {log}: cannot write into {full}: No space left on device; "
        "free space there or pass another --report-dir")


def test_demo_never_replaces_a_result(tmp_path):
    """`demo --logdir` holding a result_0.txt is refused before any work (exit 2, one error
    line), the file kept byte for byte; without --logdir each demo writes a new folder."""
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(PUBLISHED / "result_0.txt", logs / "result_0.txt")
    before = (logs / "result_0.txt").read_bytes()
    p = subprocess.run([sys.executable, "-m", "llama31_405b", "demo", "--logdir", str(logs)],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"error: demo --logdir {logs}: already holds result_0.txt (an earlier run's result, "
        "kept: a result is never replaced); choose another --logdir, or leave it unset for a "
        "new folder"]
    assert "[demo]" not in p.stdout                   # refused before the data or checkpoint
    assert (logs / "result_0.txt").read_bytes() == before
