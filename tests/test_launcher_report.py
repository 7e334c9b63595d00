"""What the launcher reported about a run's processes (launch.launcher_report), as run_and_time.sh's
outcome line adds it: torchrun's report of a rank killed with SIGKILL (recorded from torch 2.13's
torchrun on this machine, tests/fixtures/launcher/) and srun's task errors."""
from pathlib import Path

from llama31_405b.launch.launcher_report import launcher_report

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "launcher"


def test_torchrun_root_cause_names_the_killed_rank():
    text = (FIXTURES / "torchrun_sigkill.txt").read_text()
    assert launcher_report("[train] step 3 | ...\n" + text) == (
        "launcher (torchrun): rank 1 (pid 332) killed by SIGKILL first; 1 other rank(s) failed "
        "after it")


def test_torchrun_exit_code():
    text = ("Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
            "  exitcode  : 2 (pid: 77)\n")
    assert launcher_report(text) == "launcher (torchrun): rank 0 (pid 77) exited with code 2 first"


def test_srun_task_errors_in_order():
    text = ("[train] step 4 ...\nsrun: error: n3: task 2: Killed\n"
            "srun: Job step aborted: Waiting up to 12 seconds for job step to finish.\n"
            "srun: error: n1: tasks 0-1: Terminated\n")
    assert launcher_report(text) == ("launcher (srun): task 2 on n3: Killed first; then tasks "
                                     "0-1: Terminated")


def test_nothing_reported():
    assert launcher_report("[train] run_stop: status success after 180 steps\n") == ""


def test_torchrun_stopped_by_a_signal():
    text = ("Traceback (most recent call last):\n  File \"run.py\", line 1\n"
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got "
            "signal: 15\n")
    assert launcher_report(text) == ("launcher (torchrun): stopped by SIGTERM (pid 4242), which "
                                     "it passed to every rank")


# --- the console as run_and_time.sh shows it (scripts/fold_console.awk) --------------------------
REPO = Path(__file__).resolve().parents[1]
# what 4 ranks print when rank 0 failed before run_start: torch's message of a failed store call
# carries C++ frames, the same on every surviving rank (abridged from torch 2.13's output)
CPP = ("[rank{r}]: error: stopped before run_start: DistNetworkError: failed to recv, got 0 "
       "bytes (TCPStore recvValue: Interrupted system call)\n"
       "[rank{r}]: Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/"
       "Utils.hpp:678 (most recent call first):\n"
       + "".join(f"[rank{{r}}]: frame #{i}: c10::Error::Error(...) + 0x98 (0x7f in libc10.so)\n"
                 for i in range(20)))


def _fold(text: str) -> list[str]:
    import subprocess
    p = subprocess.run(["awk", "-v", "file=console_0.txt", "-f",
                        str(REPO / "scripts" / "fold_console.awk")], input=text,
                       capture_output=True, text=True, check=True)
    return p.stdout.splitlines()


def test_console_folds_cpp_frames_to_one_line_per_rank():
    text = "error: the MLPerf log cannot be opened\n" + "".join(CPP.format(r=r) for r in (1, 2, 3))
    assert _fold(text) == [
        "error: the MLPerf log cannot be opened",
        *(f"[rank{r}]: error: stopped before run_start: DistNetworkError: failed to recv, got 0 "
          "bytes (TCPStore recvValue: Interrupted system call)" for r in (1, 2, 3)),
        "[run_and_time] 63 line(s) of tracebacks and C++ frames folded here: every line is in "
        "console_0.txt"]


def test_console_folds_torchruns_tracebacks():
    """ChildFailedError (its report block too) and SignalException: the outcome line reports
    them (launcher_report); another traceback keeps its last line."""
    report = (FIXTURES / "torchrun_sigkill.txt").read_text()
    text = ("[train] step 3\n" + report + "Traceback (most recent call last):\n"
            "  File \"x.py\", line 2, in <module>\n    main()\n"
            "ValueError: something the user should see\n"
            "Traceback (most recent call last):\n  File \"run.py\", line 1\n"
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got "
            "signal: 15\n[train] after\n")
    folded = _fold(text)
    assert folded[0] == "[train] step 3"
    assert "ValueError: something the user should see" in folded
    assert folded[-2] == "[train] after"
    assert folded[-1].startswith("[run_and_time] ") and folded[-1].endswith(
        " line(s) of tracebacks and C++ frames folded here: every line is in console_0.txt")
    assert not any("Traceback" in ln or "ChildFailedError" in ln or "SignalException" in ln
                   or "=====" in ln or "exitcode" in ln for ln in folded), folded
