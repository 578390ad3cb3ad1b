"""A real S3-compatible server on loopback for tests, and a fault-injecting proxy in front of it.

``MotoS3`` runs moto's ``ThreadedMotoServer`` on 127.0.0.1 at a free port; ``bucket()`` makes
a fresh bucket (``create_bucket`` without a location constraint: moto's us-east-1 refuses
``s3fs.mkdir``), ``upload_dir`` copies a local folder into it.

``FaultProxy`` forwards HTTP to the server and, for a chosen fraction of requests, answers
503 SlowDown or 500 InternalError, resets the connection, cuts the body short, or answers
after a delay; it can also add a fixed latency to every request (the stand-in for real
object storage in the benchmark), deny (403) or never answer requests whose path contains a
given text. Which request fails is decided by a hash of (seed, method, path, range, how many
times that request was seen), so a run is the same whatever the thread timing, and a request
fails at most ``max_failures`` times in a row.

Run as a script it serves the proxy in its own process (used by benchmarks/s3_throughput.py):

    python tests/s3_server.py proxy --upstream http://127.0.0.1:5000 --latency 0.03
    python tests/s3_server.py moto                 # moto's server in this process
Both print ``PORT <n>`` once they listen.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import logging
import os
import socket
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FAULTS = ("503", "500", "reset", "truncate", "slow")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "expect"}
_ERROR_XML = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>"
              "<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----- moto -------------------------------------------------------------------------------

class MotoS3:
    """moto's S3 server in a thread on 127.0.0.1 (port 0: the OS picks a free one)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint = ""

    def start(self) -> "MotoS3":
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def bucket(self, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def upload_dir(client: Any, local: Path, bucket: str, prefix: str, threads: int = 8) -> int:
    """Copy every file under ``local`` to ``s3://bucket/prefix/<relative path>``."""
    from concurrent.futures import ThreadPoolExecutor

    files = sorted(p for p in Path(local).rglob("*") if p.is_file())

    def put(p: Path) -> None:
        key = f"{prefix.strip('/')}/{p.relative_to(local).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=p.read_bytes())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, files))
    return len(files)


def aws_env(endpoint: str) -> dict[str, str]:
    """Dummy credentials and the endpoint, as environment variables (and no config files, no
    instance metadata lookups: nothing but 127.0.0.1 is ever contacted)."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def clear_fs_cache() -> None:
    """Forget cached s3fs instances: each holds a client bound to the endpoint it started with."""
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:  # no s3fs: nothing cached
        pass
    from conveyor.storage import _storage

    _storage._SHARED.clear()  # the map functions' Storage (conveyor.storage.read_url)


# ----- pytest fixtures (import them into a test module to use them) ------------------------

class S3Env:
    """What a test gets: a fresh bucket on the module's server, the AWS variables set."""

    def __init__(self, server: MotoS3, monkeypatch: Any):
        self.server = server
        self.client = server.client()
        self.bucket = server.bucket()
        self._mp = monkeypatch
        self._proxies: list[FaultProxy] = []
        self.use_endpoint(server.endpoint)

    def url(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{path.lstrip('/')}"

    def upload(self, local: Path, prefix: str) -> str:
        upload_dir(self.client, Path(local), self.bucket, prefix)
        return self.url(prefix)

    def use_endpoint(self, endpoint: str) -> None:
        for k, v in aws_env(endpoint).items():
            self._mp.setenv(k, v)
        clear_fs_cache()

    def proxy(self, **kwargs: Any) -> FaultProxy:
        """Start a ``FaultProxy`` in front of the server and point the AWS variables at it."""
        proxy = FaultProxy(self.server.endpoint, **kwargs).start()
        self._proxies.append(proxy)
        self.use_endpoint(proxy.endpoint)
        return proxy

    def close(self) -> None:
        for proxy in self._proxies:
            proxy.stop()
        clear_fs_cache()


try:
    import pytest

    @pytest.fixture(scope="module")
    def moto_server():
        """moto's S3 server for the test module, stopped at its end."""
        server = MotoS3().start()
        yield server
        server.stop()

    @pytest.fixture
    def s3(moto_server, monkeypatch):
        """A fresh bucket, the AWS variables pointing at the server; proxies stopped after."""
        env = S3Env(moto_server, monkeypatch)
        yield env
        env.close()
except ImportError:  # run as a script without pytest: the fixtures are not needed
    pass


# ----- the proxy --------------------------------------------------------------------------

def _unit(*parts: Any) -> float:
    h = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0 ** 64


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` that injects faults.

    Args:
        upstream: the server, e.g. ``http://127.0.0.1:5000``.
        fail_rate: fraction of requests answered with a fault.
        faults: the kinds to draw from: ``503``, ``500``, ``reset``, ``truncate``, ``slow``.
        seed: the seed of the decisions.
        slow_delay: seconds a ``slow`` fault waits before forwarding.
        latency: seconds added to every request.
        max_failures: a given request fails at most this many times.
        deny: requests whose path contains this text get 403 AccessDenied.
        hang: requests whose path contains this text get no answer until the proxy stops.
        only: faults hit only requests whose path contains this text (None: all).
    """

    def __init__(self, upstream: str, *, fail_rate: float = 0.0, faults: tuple[str, ...] = FAULTS,
                 seed: int = 0, slow_delay: float = 2.0, latency: float = 0.0, max_failures: int = 2,
                 deny: str | None = None, hang: str | None = None, only: str | None = None,
                 port: int = 0):
        bad = set(faults) - set(FAULTS)
        if bad:
            raise ValueError(f"unknown faults {bad}; choose from {FAULTS}")
        self.upstream = upstream.removeprefix("http://").rstrip("/")
        self.fail_rate, self.faults, self.seed = fail_rate, tuple(faults), seed
        self.slow_delay, self.latency, self.max_failures = slow_delay, latency, max_failures
        self.deny, self.hang, self.only = deny, hang, only
        self.injected: dict[str, int] = {}
        self.requests = 0
        self.kinds: dict[str, int] = {}  # requests by kind_of: list, get, head, put...
        self._seen: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = _QuietServer(("127.0.0.1", port), _make_handler(self))
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @staticmethod
    def kind_of(method: str, path: str) -> str:
        """``list`` (a GET of a bucket: ListObjects, path-style), else the method in lower case."""
        where, _, query = path.partition("?")
        if method == "GET" and ("list-type=" in query or "/" not in where.strip("/")):
            return "list"
        return method.lower()

    def decide(self, method: str, path: str, rng: str) -> str | None:
        with self._lock:
            self.requests += 1
            kind = self.kind_of(method, path)
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            if self.deny and self.deny in path:
                fault: str | None = "deny"
            elif self.hang and self.hang in path:
                fault = "hang"
            elif self.fail_rate <= 0 or (self.only and self.only not in path):
                fault = None
            else:
                # without the bucket (path-style: the first segment), which tests make random
                key = (method, "/" + path.lstrip("/").partition("/")[2], rng)
                nth = self._seen.get(key, 0)
                self._seen[key] = nth + 1
                fault = None
                if nth < self.max_failures and _unit(self.seed, key, nth) < self.fail_rate:
                    fault = self.faults[int(_unit(self.seed, key, nth, "kind") * len(self.faults))]
            if fault is not None:
                self.injected[fault] = self.injected.get(fault, 0) + 1
            return fault


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 drops SYNs of a burst of connections: 1 s stalls

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):  # the client gave up (its timeout)
            log.debug("proxy: client %s went away: %s", client_address, exc)
            return
        super().handle_error(request, client_address)


def _make_handler(proxy: FaultProxy) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        _up: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            log.debug("proxy: " + format, *args)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _error(self, status: int, code: str, message: str) -> None:
            body = b"" if self.command == "HEAD" else _ERROR_XML.format(code=code, message=message).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _reset(self) -> None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            for attempt in (0, 1):  # a kept-alive upstream connection may have gone stale
                if self._up is None:
                    self._up = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    self._up.request(self.command, self.path, body=body or None, headers=headers)
                    resp = self._up.getresponse()
                    data = resp.read()
                    return resp.status, resp.getheaders(), data
                except (OSError, http.client.HTTPException):
                    self._up.close()
                    self._up = None
                    if attempt:
                        raise
            raise AssertionError("unreachable")

        def _handle(self) -> None:
            body = self._body()
            fault = proxy.decide(self.command, self.path, self.headers.get("Range", ""))
            if proxy.latency:
                time.sleep(proxy.latency)
            if fault == "deny":
                return self._error(403, "AccessDenied", "Access Denied")
            if fault == "hang":
                proxy._stopping.wait(120)
                return self._reset()
            if fault == "503":
                return self._error(503, "SlowDown", "Please reduce your request rate.")
            if fault == "500":
                return self._error(500, "InternalError", "We encountered an internal error.")
            if fault == "reset":
                return self._reset()
            if fault == "slow":
                time.sleep(proxy.slow_delay)
            try:
                status, headers, data = self._forward(body)
            except (OSError, http.client.HTTPException) as exc:
                return self._error(502, "BadGateway", f"upstream: {exc}")
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in _HOP and not (k.lower() == "content-length" and self.command != "HEAD"):
                    self.send_header(k, v)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if fault == "truncate" and len(data) > 1:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                return self._reset()
            if self.command != "HEAD":
                self.wfile.write(data)

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                if self._up is not None:
                    self._up.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


# ----- as a script ------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("proxy")
    p.add_argument("--upstream", required=True)
    p.add_argument("--latency", type=float, default=0.0)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    m = sub.add_parser("moto")
    m.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.what == "proxy":
        server: Any = FaultProxy(args.upstream, latency=args.latency, fail_rate=args.fail_rate,
                                 seed=args.seed, port=args.port).start()
        port = server.endpoint.rsplit(":", 1)[1]
    else:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=args.port, verbose=False)
        server.start()
        port = server.get_host_and_port()[1]
    print(f"PORT {port}", flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin (or dies)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
