"""What the main process knows of its worker processes, and ending them within a bound.

A worker stopped with SIGSTOP (or held by a debugger) neither exits when asked nor dies of
SIGTERM until it is continued; ``multiprocessing``'s own exit hook terminates and then joins
daemonic children without a bound, so one stopped worker held ``close()`` for 10 s and the
interpreter's exit for ever (issue 13). ``end_processes`` gives workers ``wait`` seconds to
leave on their own, kills a stopped one at once, and kills with SIGKILL (which a stopped
process does not hold off) whatever is left when the time is up.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Iterable

from conveyor.errors import WorkerError

log = logging.getLogger(__name__)

_STATES = {"R": "running", "S": "waiting", "D": "in uninterruptible I/O", "Z": "exited (a zombie)",
           "T": "stopped (SIGSTOP, or a debugger)", "t": "stopped by a debugger", "X": "dead"}


def state(pid: int | None) -> str | None:
    """The process's state letter from /proc (``T``: stopped), or None where unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def describe(proc: Any) -> str:
    """``pid 123, stopped (SIGSTOP, or a debugger)`` for a ``multiprocessing`` process."""
    pid = getattr(proc, "pid", None)
    letter = state(pid)
    if letter is None:
        alive = proc.is_alive() if hasattr(proc, "is_alive") else None
        return f"pid {pid}, " + ("alive" if alive else f"exit code {getattr(proc, 'exitcode', None)}")
    return f"pid {pid}, {_STATES.get(letter, letter)}"


def _stopped(proc: Any) -> bool:
    return state(getattr(proc, "pid", None)) in ("T", "t")


def end_processes(named: Iterable[tuple[str, Any]], *, wait: float) -> list[str]:
    """Join processes already asked to stop, given as ``(name, process)``, within ``wait``
    seconds; kill a stopped one at once and any still alive after ``wait``. Returns what was
    killed, in words (also logged as a warning)."""
    left = [(name, p) for name, p in named if p.pid is not None]
    deadline = time.monotonic() + wait
    killed: list[str] = []
    while left:
        now = time.monotonic()
        for name, p in list(left):
            if not p.is_alive():
                left.remove((name, p))
                continue
            stopped = _stopped(p)
            if stopped or now >= deadline:
                killed.append(f"{name} ({describe(p)})" if stopped else
                              f"{name} ({describe(p)}; still there {wait:.0f} s after it was asked to stop)")
                p.kill()
                p.join(timeout=2)
                left.remove((name, p))
        if left:
            left[0][1].join(timeout=0.05)
    if killed:
        log.warning("closing: killed %s", "; ".join(killed))
    return killed


def death(worker: Any) -> str:
    """Why a worker that sent no error is gone, in words."""
    code = getattr(worker, "exitcode", None)
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else "an unnamed signal"
        hint = ": often the out-of-memory killer" if -code == signal.SIGKILL else ""
        return f"was killed by signal {-code} ({name}){hint}"
    if code == 1:
        return ("exited with code 1 before it could report an error (its traceback is on stderr); "
                "if that shows it importing your script: under spawn a worker imports the main "
                "script again, so a script that starts the loader at import time needs "
                "`if __name__ == '__main__':`")
    return f"stopped (exit code {code}) without an error message; look for a crash in native code"


def died(worker: Any, where: str, what: str = "worker") -> WorkerError:
    """The error for a worker process gone under the loader: ``node 'decode' (map): worker
    (pid 1234) was killed by signal 9 (SIGKILL): ...``, with the pid and exit code as fields."""
    pid = getattr(worker, "pid", None)
    return WorkerError(f"{where}: {what} (pid {pid}) {death(worker)}", node=where, pid=pid,
                       exitcode=getattr(worker, "exitcode", None))


class DeathWatch:
    """A thread that waits on worker processes' sentinels and notices one that dies unasked.

    A worker killed by the out-of-memory killer sends nothing: whoever waits for its result
    would wait for ever. The thread waits on the processes' sentinels (``multiprocessing.
    connection.wait``: no polling of its own, and nothing on the items' path); on the first
    exit while ``stopping()`` is false it keeps the ``WorkerError`` in ``error`` and calls
    ``wake()``, which must make the waiting consumer return and look at ``error``. The thread
    ends once ``stopping()`` is true (looked at every ``POLL`` seconds).

    Args:
        procs: the worker processes, started.
        where: the node they work for, for the error.
        stopping: whether the workers were asked to leave (their exit is then no death).
        wake: called once, after ``error`` is set.
        what: the workers in words (``worker``, ``worker copy 1``).
        stalled: called every ``POLL`` seconds where given: the ``WorkerError`` for workers
            alive but too long silent (a map's ``timeout``), or None; the error is kept and
            ``wake()`` called as for a death.
    """

    POLL = 0.5

    def __init__(self, procs: Iterable[Any], *, where: str, stopping: Any, wake: Any, what: str = "worker",
                 stalled: Any = None):
        self.procs = list(procs)
        self.where = where
        self.what = what
        self.stopping = stopping
        self.wake = wake
        self.stalled = stalled
        self.error: WorkerError | None = None
        self.thread = threading.Thread(target=self._run, name="conveyor-death-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from multiprocessing.connection import wait

        left = {p.sentinel: p for p in self.procs if p.pid is not None}
        while left and not self.stopping():
            for sentinel in wait(list(left), timeout=self.POLL):
                proc = left.pop(sentinel)
                if self.stopping():
                    return
                proc.join(timeout=1)  # reaped: its exit code is known
                self.error = died(proc, self.where, self.what)
                self.wake()
                return
            stall = self.stalled() if self.stalled is not None else None
            if stall is not None and not self.stopping():
                self.error = stall
                self.wake()
                return


def check_timeout(timeout: Any) -> None:
    """Refuse a worker ``timeout`` (seconds a worker may stay silent) that is not a positive
    number or None (no limit): a ``ValueError`` showing the value."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"{timeout=} must be a positive number of seconds, or None (no limit)")


_said: set[str] = set()


def threads_instead(start_method: str | None, what: str) -> bool:
    """True (and a warning, once per process) when worker processes cannot start here.

    ``spawn`` and ``forkserver`` start a fresh interpreter that imports the main script
    again by its path; a main module read from stdin (``python - <<EOF``, ``__file__`` is
    ``'<stdin>'``) or from a file since removed has no path to import, and every worker would
    die at start. The caller then runs ``what`` in threads: the same items, in the same
    order, only slower where ``fn`` holds the GIL.

    Args:
        start_method: the multiprocessing start method (None: the default one).
        what: the workers in words, for the warning.
    """
    import multiprocessing as mp
    import os
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        return False  # python -c, a REPL, python -m: nothing (or a module name) to import again
    if os.path.exists(path):
        return False
    if mp.get_context(start_method).get_start_method() not in ("spawn", "forkserver"):
        return False
    if what not in _said:
        _said.add(what)
        log.warning("%s: worker processes need a script file: the main module comes from %r "
                    "(python - reads it from stdin), which a new worker process cannot import again; "
                    "running them in threads instead (the same items in the same order, slower where "
                    "fn holds the GIL). Save the code to a .py file and run that to get processes.",
                    what, path)
    return True
