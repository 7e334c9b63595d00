"""Signals and stop requests, in-process: the watchdog thread (not the main thread) reports the
signal at once; a run that reached its target keeps its success; a signal or a broken log that
came first wins over a later success."""
import os
import signal
import threading

from llama31_405b.train.failure import SignalWatch, StopRequest


def test_the_watchdog_thread_reports_the_signal_at_once():
    seen = []
    fired = threading.Event()

    def on_signal(reason):
        seen.append((reason, threading.current_thread().name))
        fired.set()

    before = signal.getsignal(signal.SIGTERM)
    watch = SignalWatch(on_signal=on_signal, grace_s=3600).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert fired.wait(30), "on_signal was never called"
    finally:
        watch.uninstall()
    assert seen == [("received SIGTERM", "signal-watchdog")]
    assert signal.getsignal(signal.SIGTERM) == before      # the previous handler is back


def test_other_signals_on_the_wakeup_fd_do_not_stop_the_run():
    calls = []
    old = signal.signal(signal.SIGUSR1, lambda *a: None)   # a Python handler: on the wakeup fd too
    watch = SignalWatch(on_signal=calls.append, grace_s=3600).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(300):
            if calls:
                break
            threading.Event().wait(0.1)
    finally:
        watch.uninstall()
        signal.signal(signal.SIGUSR1, old)
    assert calls == ["received SIGINT"]


def test_target_reached_before_the_signal_keeps_its_success():
    stop, logged = StopRequest(), []
    assert stop.finish()
    stop.signal("received SIGTERM", logged.append)
    assert logged == []                            # the loop logs run_stop success itself


def test_signal_before_the_target_wins():
    stop, logged = StopRequest(), []
    stop.signal("received SIGTERM", logged.append)
    assert logged == ["received SIGTERM"] and stop.requested
    assert not stop.finish()


def test_a_broken_log_forbids_success_and_the_first_reason_is_kept():
    stop = StopRequest()
    stop.request("cannot write the MLPerf log x: No space left on device (ENOSPC)", error=True)
    stop.request("later reason")
    assert not stop.finish()
    assert stop.reason.startswith("cannot write the MLPerf log x")
