# SPDX-License-Identifier: Apache-2.0
"""arbiter.signals: real signals, each case in a Python process of its own (the waiter owns
the interpreter's one wake-up fd and its handlers)."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from support.paths import ROOT

_PRELUDE = """
import os, signal, sys, threading, time
from arbiter.signals import SignalWaiter, stop_on_signals
"""


def _python(script: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(script)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _names(numbers: set[int]) -> list[str]:
    return sorted(signal.Signals(n).name for n in numbers)


def test_each_wait_answers_the_signals_that_came_since_the_last():
    out = _python("""
        w = SignalWaiter((signal.SIGHUP, signal.SIGTERM))
        os.kill(os.getpid(), signal.SIGHUP)
        print(*sorted(w.wait()), sep=',')
        os.kill(os.getpid(), signal.SIGTERM)
        print(*sorted(w.wait()), sep=',')  # the SIGHUP's handler ran meanwhile: no second one
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        print(*sorted(w.wait()), sep=',')
        w.close()
    """)
    assert out.returncode == 0, out.stderr
    answers = [{int(n) for n in line.split(",")} for line in out.stdout.split()]
    assert [_names(a) for a in answers] == [["SIGHUP"], ["SIGTERM"], ["SIGHUP", "SIGTERM"]]


def test_a_waiter_thread_sees_a_signal_the_main_thread_never_handles():
    """The main thread has SIGTERM blocked and sits in Event.wait(): the kernel delivers the
    signal to the waiter's thread, whose C handler writes the byte; the Python handler
    cannot run until the main thread runs bytecode, which it does only once the Event is
    set. A waiter that trusted the handlers slept on (the plugins' CI failure of 5cade30)."""
    out = _python("""
        stop = stop_on_signals()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the main thread only
        os.kill(os.getpid(), signal.SIGTERM)
        print("stopped" if stop.wait(20) else "timed out", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["stopped"]


def test_a_signal_whose_byte_a_full_pipe_dropped_is_still_answered():
    out = _python("""
        w = SignalWaiter((signal.SIGHUP, signal.SIGTERM))
        try:  # fill the wake-up pipe with bytes that are no signal of the waiter's
            while True:
                os.write(w._write, bytes(4096))
        except BlockingIOError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # its byte is dropped: only the handler saw it
        print(*sorted(w.wait()), sep=',')
        os.kill(os.getpid(), signal.SIGHUP)   # the pipe drained: bytes again
        print(*sorted(w.wait()), sep=',')
        w.close()
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(int(signal.SIGTERM)), str(int(signal.SIGHUP))]


def test_a_storm_ends_at_its_sigterm_and_closes_clean():
    """A second process sends 2,000 SIGHUPs and then one SIGTERM: every answer is some of
    those two, the last has the SIGTERM, and close lets the interpreter's wake-up fd go."""
    out = _python("""
        import subprocess
        w = SignalWaiter((signal.SIGHUP, signal.SIGTERM))
        sender = subprocess.Popen([sys.executable, "-c",
            "import os, signal, sys\\n"
            "pid = int(sys.argv[1])\\n"
            "for _ in range(2000): os.kill(pid, signal.SIGHUP)\\n"
            "os.kill(pid, signal.SIGTERM)\\n", str(os.getpid())])
        answers = [w.wait()]
        while signal.SIGTERM not in answers[-1]:
            answers.append(w.wait())
        sender.wait()
        w.close()
        print(all(a <= {signal.SIGHUP, signal.SIGTERM} for a in answers),
              signal.set_wakeup_fd(-1))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "-1"]
