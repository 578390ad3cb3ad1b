"""The pipe from a worker copy to the main process: messages written by the worker's own
thread, big buffers sent without being copied into a pickle first.

``multiprocessing.Queue`` hands every put to a feeder thread, which must win the GIL from the
worker's own (busy, pure-Python) thread first; a pipe written directly does not wait for
that, and a full pipe blocks ``put``: that is the back-pressure.

A message is pickled with protocol 5 and its out-of-band buffers (the ``PickleBuffer`` that
``chunk_packing.pack`` makes of a chunk's tensor bytes) are written to the pipe straight from their
memory; the main process reads each into one new ``bytearray`` and unpickles around them. Going
through ``Connection.send_bytes``/``recv_bytes`` instead copied a 4.8 MB image batch five times
on its way. Where ``os.readv`` is missing (Windows), messages go through the ``Connection``
whole, buffers in-band.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
from typing import Any

_LEN = struct.Struct("<Q")
_RAW = hasattr(os, "readv")


class PipeOut:
    """A worker's end: ``put(msg)`` pickles and writes in the calling thread.

    With ``credits`` (a semaphore the main process releases as it takes each chunk), a chunk
    (``msg[1] == "items"``) waits for a credit first: chunks whose big tensors sit in shared
    memory are small in the pipe, so the pipe's size alone would not bound what a worker runs
    ahead. ``put`` raises ``queue.Full`` when ``timeout`` passes without one, and
    ``BrokenPipeError`` once ``stop`` is set or the main process is gone (``parent``, a
    ``parent_watch.Parent``: nobody will give a credit again).
    """

    def __init__(self, conn: Any, credits: Any = None, stop: Any = None, parent: Any = None):
        self.conn = conn
        self.credits = credits
        self.stop = stop
        self.parent = parent

    def put(self, msg: tuple, timeout: float | None = None) -> None:
        if self.credits is not None and msg[1] == "items":
            waited = 0.0
            while not self.credits.acquire(timeout=0.1):
                waited += 0.1
                if self.stop is not None and self.stop.is_set():
                    raise BrokenPipeError("closing")
                if self.parent is not None and self.parent.gone():
                    raise BrokenPipeError("the main process is gone")
                if timeout is not None and waited >= timeout:
                    raise queue.Full
        if not _RAW:
            self.conn.send_bytes(pickle.dumps(msg, protocol=5))
            return
        bufs: list[pickle.PickleBuffer] = []
        body = pickle.dumps(msg, protocol=5, buffer_callback=bufs.append)
        views = [b.raw() for b in bufs]
        head = pickle.dumps((body, [v.nbytes for v in views]), protocol=5)
        fd = self.conn.fileno()
        _write_all(fd, _LEN.pack(len(head)) + head)
        for view in views:
            _write_all(fd, view)


class PipeIn:
    """The main process's end, with ``queue.Queue``'s ``get``; ``EOFError`` or ``OSError``
    when the worker is gone (``OSError``: half-way through a message)."""

    def __init__(self, conn: Any):
        self.conn = conn

    def get(self, timeout: float | None = None) -> tuple:
        if not self.conn.poll(timeout):
            raise queue.Empty
        if not _RAW:
            return pickle.loads(self.conn.recv_bytes())
        fd = self.conn.fileno()
        (size,) = _LEN.unpack(_read_exactly(fd, _LEN.size, first=True))
        body, sizes = pickle.loads(_read_exactly(fd, size))
        return pickle.loads(body, buffers=[_read_exactly(fd, n) for n in sizes])

    def close(self) -> None:
        self.conn.close()


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int, first: bool = False) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            if first and got == 0:
                raise EOFError
            raise OSError("got end of file during message")
        got += k
    return buf


def make_pipe(ctx: Any, size: int) -> tuple[PipeIn, Any]:
    """A one-way pipe whose kernel buffer holds ``size`` bytes where Linux allows it; returns
    the main process's end and the ``Connection`` to hand to the worker."""
    read, write = ctx.Pipe(duplex=False)
    try:
        import fcntl

        fcntl.fcntl(write.fileno(), fcntl.F_SETPIPE_SZ, size)
    except (ImportError, AttributeError, OSError):
        pass  # the default (64 KiB on Linux) still works, with less read-ahead
    return PipeIn(read), write
