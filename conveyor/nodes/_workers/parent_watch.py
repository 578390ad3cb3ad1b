"""Worker processes end with the process that started them.

A main process killed with SIGKILL runs no cleanup: its worker processes (``copies``' and
``map``'s with ``method: process``) are re-parented and would wait for ever on a queue or a
credit that nobody will give (issue 13: ~250 MB each, for ever). ``watch_parent`` makes a
worker end with its parent in two ways:

- on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the worker when the
  thread that started it ends, whatever the worker is doing (inside ``fn`` too). Only asked
  for when that thread is the main thread: a worker started from a thread that ends before
  the loader does would be killed with it.
- everywhere, a daemon thread that looks every ``POLL`` seconds whether the parent changed
  (``os.getppid()``: a re-parented process has a new one) or the main process has ended (no
  such pid, or a zombie nobody has reaped yet), and ends the process if so; the workers' own
  waits ask ``Parent.gone()`` too.

A worker can reach its watch after the main process died (a fork that ran late on a busy
machine): it is re-parented by then, so the parent it sees at start is already the new one.
The main process then counts as ended when its pid is gone *or a zombie*: the kernel
re-parents the children when a process dies, before whoever started it reaps it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

from conveyor.nodes._workers.child_processes import state

log = logging.getLogger(__name__)

POLL = 0.5
_PR_SET_PDEATHSIG = 1


class Parent:
    """What a worker knows of its parent: its pid as the worker saw it at start.

    Args:
        pid: the process that started the worker (``os.getpid()`` there); under
            ``forkserver`` the worker's parent is the fork server, and that is what is watched.
    """

    def __init__(self, pid: int):
        self.pid = pid
        self.ppid = os.getppid()

    def gone(self) -> bool:
        """True once the worker's parent has changed (it died and the worker was re-parented)."""
        return os.getppid() != self.ppid


def _pdeathsig() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _ended(pid: int) -> bool:
    """``pid`` has ended: no such process, or a zombie (dead, not reaped yet; Linux's /proc
    says so, elsewhere a zombie counts as alive and the parent check must see the death)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return state(pid) == "Z"


def _exit(what: str, parent: Parent) -> None:
    log.warning("%s (pid %d): the process that started it (pid %d) is gone; exiting",
                what, os.getpid(), parent.pid)
    os._exit(1)


def _watch(what: str, parent: Parent) -> None:
    while not parent.gone() and not _ended(parent.pid):
        time.sleep(POLL)
    _exit(what, parent)


def watch_parent(pid: int, *, what: str, from_main_thread: bool) -> Parent:
    """In a worker process: end it when its parent ends; returns the ``Parent`` for waits.

    Args:
        pid: the parent's pid as the parent saw it (``os.getpid()`` before starting the worker).
        what: the worker in words, for the message it logs as it exits.
        from_main_thread: the worker was started from the parent's main thread (then the
            kernel may kill it when the parent dies: see the module's docstring).
    """
    if from_main_thread:
        _pdeathsig()
    parent = Parent(pid)
    if parent.ppid != pid and _ended(pid):  # it died before the watch began (re-parented already)
        _exit(what, parent)
    threading.Thread(target=_watch, args=(what, parent), name="conveyor-parent-watch", daemon=True).start()
    return parent
