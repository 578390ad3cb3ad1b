"""Real processes without paying torch's start-up each time, for the suite's subprocess tests.

A test that runs ``python -m conveyor ...`` or ``python some_script.py ...`` pays ~1.5 s of CPU
for the interpreter and ``import torch`` before the command does anything; on a busy 2-core
machine that start-up, paid by a few dozen commands, was minutes of the suite. ``Forker`` starts
this file once as a server that imports torch, numpy, PIL, yaml, fsspec and torchdata, then
forks one child per command. Each child is a process of its own, as ``subprocess.run`` would start: its own session
(``os.setsid``: a timeout kills its whole group), its own cwd, environment, ``sys.argv`` and
``sys.path`` (computed as a fresh interpreter computes them from ``PYTHONPATH``), stdout and
stderr to files, stdin from /dev/null, ``-m`` or the script run as ``__main__`` through runpy, and
the interpreter's own exit at the end (atexit, thread joins): the exit code is the process's.
Nothing of the command (conveyor included) is imported before the fork, only the third-party
libraries every command imports anyway.

Only ``[sys.executable, "-m", module, ...]`` and ``[sys.executable, script.py, ...]`` go through
the server; anything else (``-c``, ``-P``, torchrun's launcher, other flags) is a plain
``subprocess.run``. Tests about the interpreter's own start or exit keep plain processes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


class Forker:
    """Client of one server process; ``run`` is a drop-in for ``subprocess.run(capture_output=True,
    text=True)`` on the two command shapes above. Thread-safe: commands run one at a time."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each child sets its own
        self._proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env=env, cwd=Path(__file__).resolve().parent)
        self._lock = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="forked-python-")
        self._n = 0
        self._buf = b""

    def run(self, cmd: list[str], *, cwd: str | Path | None = None, env: dict | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess:
        shape = _shape(cmd)
        if shape is None or self._proc.poll() is not None:
            return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        with self._lock:
            self._n += 1
            out, err = (Path(self._tmp.name) / f"{self._n}.{s}" for s in ("out", "err"))
            req = {"kind": shape[0], "target": shape[1], "argv": shape[2],
                   "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()),
                   "env": dict(os.environ if env is None else env), "stdout": str(out), "stderr": str(err)}
            self._proc.stdin.write((json.dumps(req) + "\n").encode())
            self._proc.stdin.flush()
            pid = self._reply(None)["pid"]
            try:
                rc = self._reply(timeout)["rc"]
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._reply(None)
                raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(errors="replace"),
                                                err.read_text(errors="replace")) from None
            result = subprocess.CompletedProcess(cmd, rc, out.read_text(errors="replace"),
                                                 err.read_text(errors="replace"))
            out.unlink()
            err.unlink()
            return result

    def _reply(self, timeout: float | None) -> dict:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired("forked command", timeout)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the forked_python server ended (exit code {self._proc.wait()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()
        self._tmp.cleanup()


def _shape(cmd: list[str]) -> tuple[str, str, list[str]] | None:
    """("module", name, argv) for ``python -m name ...``, ("path", script, argv) for ``python
    script.py ...``; None for any other command line."""
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return None
    if cmd[1] == "-m" and len(cmd) >= 3 and cmd[2] != "torch.distributed.run":
        return "module", cmd[2], [cmd[2], *cmd[3:]]  # runpy puts the module's file in argv[0]
    if not cmd[1].startswith("-") and cmd[1].endswith(".py"):
        return "path", cmd[1], list(cmd[1:])
    return None


# ----- the server (this file run as a script) ----------------------------------------------

def _serve() -> dict:
    """Answer requests until stdin closes; returns (in a forked child only) the child's request."""
    import importlib

    for name in ("numpy", "PIL.Image", "torch", "yaml", "fsspec", "torchdata.nodes"):
        try:  # the start-up every command pays, paid once here
            importlib.import_module(name)
        except ImportError:
            pass

    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.dup(1)
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = requests.read(65536)
            if not chunk:
                sys.exit(0)
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            os.close(replies)
            return req
        os.write(replies, (json.dumps({"pid": pid}) + "\n").encode())
        _, status = os.waitpid(pid, 0)
        os.write(replies, (json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n").encode())


def _become(req: dict) -> None:
    """Make this forked child the process ``req`` names, short of running its code."""
    import io

    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    # sys.path as a fresh interpreter builds it: the first entry, PYTHONPATH's (absolute, an
    # empty one is the cwd), then the interpreter's own (this server started without PYTHONPATH)
    first = req["cwd"] if req["kind"] == "module" else os.path.dirname(os.path.realpath(req["target"]))
    extra = [os.path.abspath(p) if p else req["cwd"]
             for p in req["env"].get("PYTHONPATH", "").split(os.pathsep)] if req["env"].get("PYTHONPATH") else []
    sys.path[:] = [first, *extra, *sys.path[1:]]
    sys.argv[:] = req["argv"]


if __name__ == "__main__":
    sys.path.pop(0)  # tests/ is no command's own path entry
    sys.path.insert(0, "")  # a placeholder _become replaces
    _req = _serve()
    _become(_req)
    import runpy

    if _req["kind"] == "module":
        runpy.run_module(_req["target"], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(_req["target"], run_name="__main__")
