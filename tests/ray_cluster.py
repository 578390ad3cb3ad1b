"""A real two-node Ray cluster on 127.0.0.1 for the tests: a head and a second node, each a
``ray start --block`` process this module starts and ends by its pid (``ray stop`` would end
every Ray on the machine, other users' too). Small: 2 CPUs and 200 MB of object store a node,
no dashboard, no usage stats, every port free when asked for, its own temp dir; a dead node is
found within seconds (``NODE_ENV``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field


# No usage stats, and no token authentication: a local ray.init (a benchmark, a user's own)
# leaves ~/.ray/auth_token behind, and a head started after it then asks every client for it
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           # and 127.0.0.1 stays 127.0.0.1: Ray turns it into the interface address otherwise
           # (tests/ray_loopback.py), and every connection of the cluster went through that
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# A node whose raylet is gone is found within seconds, not Ray's default 15 s and more (a
# health check every 3 s, 5 failures): the node-removal test waits for it. Not so tight that a
# busy host's slow answer reads as a death.
NODE_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
            "RAY_health_check_failure_threshold": "4",
            # an object that does not fit a node's 200 MB store is an error at once, as on a node
            # whose disk is full too (by default Ray allocates it on disk instead: slower, whole)
            "RAY_local_fs_capacity_threshold": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_args(temp: str) -> list[str]:
    return ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--object-store-memory=200000000",
            "--disable-usage-stats", f"--metrics-export-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--temp-dir={temp}"]


@dataclass
class Cluster:
    address: str
    temp: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def node_of(self, pid: int) -> int:
        """The index of the node (of ``procs``) whose processes include ``pid``."""
        import psutil

        for i, proc in enumerate(self.procs):
            if pid in {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}:
                return i
        raise LookupError(f"pid {pid} is no process of this cluster's nodes")

    def remove_node(self, node: int) -> int:
        """Take node ``node`` (0: the head) away as a machine goes: its raylet SIGKILLed by its
        pid, then every other process of the node (the actors' workers, the agents: they
        outlive a raylet for a while), so that no actor of it answers on. Returns the raylet's pid."""
        import psutil

        proc = self.procs[node]
        tree = psutil.Process(proc.pid).children(recursive=True)  # before they are orphaned
        raylets = [p for p in tree if p.name() == "raylet"]
        assert len(raylets) == 1, raylets
        os.kill(raylets[0].pid, signal.SIGKILL)
        for p in tree + [psutil.Process(proc.pid)]:  # the workers have sessions of their own
            try:
                p.kill()  # by pid; psutil checks it is still the process it found
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=30)
        return raylets[0].pid

    def stop(self, keep_logs: bool = False) -> None:
        """End each node: every process of it by its pid (the actors' workers have sessions of
        their own, and outlive their raylet for a while), then its ``ray start --block``."""
        import psutil

        for proc in reversed(self.procs):  # SIGTERM drains for 30 s: a test cluster has nothing to drain
            try:
                tree = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:  # removed already (remove_node)
                tree = []
            for p in tree:
                try:
                    p.kill()  # by pid; psutil checks it is still the process it found
                except psutil.NoSuchProcess:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
        if not keep_logs:
            shutil.rmtree(self.temp, ignore_errors=True)


def start_cluster(timeout: float = 90.0) -> Cluster:
    """A head and a second node; returns once both are up."""
    here = os.path.dirname(os.path.abspath(__file__))  # the actors import conveyor and the tests' fns
    path = os.pathsep.join([os.path.dirname(here), here] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, **RAY_ENV, **NODE_ENV, PYTHONPATH=path)
    temp = tempfile.mkdtemp(prefix="cr", dir="/tmp")  # short: Ray's socket paths have a limit
    port = free_port()
    cluster = Cluster(f"127.0.0.1:{port}", temp)
    log = open(os.path.join(temp, "head.log"), "w")
    head = ["ray", "start", "--head", f"--port={port}", "--include-dashboard=false"] + _node_args(temp)
    cluster.procs.append(subprocess.Popen(head, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    try:
        _wait_nodes(cluster, 1, timeout)
        second = [sys.executable, os.path.join(here, "ray_loopback.py"), "start",
                  f"--address={cluster.address}"] + _node_args(temp)
        log2 = open(os.path.join(temp, "node2.log"), "w")
        cluster.procs.append(subprocess.Popen(second, env=env, stdout=log2, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        _wait_nodes(cluster, 2, timeout)
    except BaseException:
        cluster.stop(keep_logs=True)
        raise
    return cluster


def _wait_nodes(cluster: Cluster, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in cluster.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}; see {cluster.temp}")
        out = subprocess.run(["ray", "status", f"--address={cluster.address}"], capture_output=True,
                             text=True, env=dict(os.environ, **RAY_ENV))
        if out.returncode == 0 and out.stdout.count("node_") >= n:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the Ray cluster at {cluster.address} did not show {n} nodes within {timeout:.0f} s")
