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
