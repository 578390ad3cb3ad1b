"""Faults of object storage, injected by a proxy between s3fs and a real S3 server (moto):
transient ones are retried and counted and every sample still arrives exactly once; permanent
ones fail at once with the URL; nothing hangs."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from torchdata.nodes import IterableWrapper

from conveyor import SampleError, SourceError, load_graph
from conveyor.nodes.fetch import Fetch
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.read_tar import ReadTar
from conveyor.pack import pack
from conveyor.storage import (DENIED, NO_BUCKET, NOT_FOUND, PERMANENT, TRANSIENT, RetryPolicy,
                              Storage, classify, redact)
from resume_check import fingerprint
from s3_server import MotoS3, aws_env, clear_fs_cache, upload_dir
from s3_server import moto_server, s3  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "examples/data/imagenet-sample/train"
CLASSES = ("n01440764", "n02102040", "n03000684")  # 3 of the 10 classes: 60 images
QUICK = RetryPolicy(attempts=6, timeout=1.0, backoff=0.01, backoff_max=0.05)
# for the tests that count no retry at all: a request only times out after 30 s, so a busy
# machine (moto answering in over 1 s beside two busy loops and three other test workers: 16
# retries of objects nobody denied) is not taken for a retried error
PATIENT = RetryPolicy(attempts=6, timeout=30.0, backoff=0.01, backoff_max=0.05)

SPEC = """\
params: {{root: {root}, seed: 0}}
nodes:
  files:   {{op: list_files, url: "${{root}}/*/*.JPEG", label: parent_dir, shuffle: true}}
  shuffle: {{op: shuffle_buffer, size: 16}}
  fetch:   {{op: fetch, concurrency: 8, attempts: 6, timeout: 1.0, backoff: 0.01, backoff_max: 0.05}}
  decode:  {{op: map, fn: "conveyor.image:train_transform", args: {{size: 24}}, workers: 2}}
  batch:   {{op: batch, size: 8}}
  collate: {{op: collate}}
output: collate
"""


@pytest.fixture
def loose(s3) -> str:
    for cls in CLASSES:
        s3.upload(SAMPLE / cls, f"loose/{cls}")
    return s3.url("loose")


def _run(spec: Path) -> tuple[list, list[int], dict]:
    """Batch fingerprints, the sample indices in the order they came, and the node stats."""
    with load_graph(spec) as loader:
        batches = list(loader)
        return ([fingerprint(b) for b in batches], [i for b in batches for i in b["index"].tolist()],
                loader.stats()["nodes"])


def test_every_sample_arrives_once_through_503s_resets_cuts_and_slow_answers(s3, loose, tmp_path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(root=loose))
    reference, ref_indices, _ = _run(spec)
    proxy = s3.proxy(fail_rate=0.35, seed=7, slow_delay=1.5, only=".JPEG")
    t0 = time.monotonic()
    faulty, indices, stats = _run(spec)
    assert time.monotonic() - t0 < 30
    assert set(proxy.injected) == {"503", "500", "reset", "truncate", "slow"}, proxy.injected
    assert len(indices) == len(set(indices)) == 60  # every sample, once
    assert indices == ref_indices and faulty == reference  # in the same order, the same pixels
    assert stats["fetch"]["items"] == 60 and stats["fetch"]["skipped"] == 0
    assert stats["fetch"]["retries"] >= sum(proxy.injected.values()) // 2 > 0
    assert stats["fetch"]["requests"] == 60 + stats["fetch"]["retries"]


def test_shards_stream_through_faults(s3, tmp_path) -> None:
    local = tmp_path / "shards"
    src = tmp_path / "src"
    for cls in CLASSES:
        (src / cls).mkdir(parents=True)
        for f in (SAMPLE / cls).iterdir():
            (src / cls / f.name).write_bytes(f.read_bytes())
    pack(str(src), str(local), shard_size="400kB")
    root = s3.upload(local, "shards")
    expected = list(ReadTar(ListFiles(url=f"{local}/*.tar")))
    proxy = s3.proxy(fail_rate=0.4, seed=3, slow_delay=1.5, only=".tar")
    node = ReadTar(ListFiles(url=f"{root}/*.tar"), block_size=64 << 10, read_ahead=3, policy=QUICK)
    got = list(node)
    node.close()
    assert [(s["__key__"], s["jpg"], s["index"]) for s in got] == \
        [(s["__key__"], s["jpg"], s["index"]) for s in expected]
    assert node.stats()["retries"] > 0 and sum(proxy.injected.values()) > 0


def test_listing_is_retried_too(s3, loose) -> None:
    s3.proxy(fail_rate=1.0, max_failures=1, faults=("503",))
    st = Storage(policy=QUICK)
    found = st.glob(f"{loose}/*/*.JPEG")
    assert len(found) == 60 and found == sorted(found) and found[0].startswith("s3://")
    assert st.stats.as_dict()["retries"] > 0


def test_missing_bucket_and_empty_glob_fail_at_once_naming_the_url(s3) -> None:
    t0 = time.monotonic()
    with pytest.raises(SourceError, match="s3://no-such-bucket-4c1e/train") as info:
        with load_graph(ROOT / "specs/imagenet.yaml", root="s3://no-such-bucket-4c1e/train") as loader:
            next(iter(loader))
    assert any("node 'files' (list_files) from" in note for note in info.value.__notes__)
    st = Storage(policy=PATIENT)
    with pytest.raises(SourceError, match=r"s3://no-such-bucket-4c1e/x/\*\.tar: the bucket does not exist"):
        st.glob("s3://no-such-bucket-4c1e/x/*.tar")
    with pytest.raises(SourceError, match=rf"no file matches 's3://{s3.bucket}/empty/\*\.tar'"):
        st.glob(s3.url("empty/*.tar"))
    for url in ("s3://no-such-bucket-4c1e", "s3://no-such-bucket-4c1e/"):  # a bucket as the root
        with pytest.raises(SourceError, match=r"\(s3://no-such-bucket-4c1e does not exist\)"):
            ListFiles(url=url).records()
    with pytest.raises(SourceError, match="s3://no-such-bucket-4c1e/a.jpg: the bucket does not exist"):
        st.read("s3://no-such-bucket-4c1e/a.jpg")
    assert st.stats.as_dict()["retries"] == 0
    assert time.monotonic() - t0 < 10


def test_missing_object_and_denied_access_are_not_retried(s3, loose) -> None:
    st = Storage(policy=PATIENT)
    with pytest.raises(SampleError, match=rf"s3://{s3.bucket}/loose/nope.JPEG: no such object"):
        st.read(s3.url("loose/nope.JPEG"))
    assert st.stats.as_dict() == {"requests": 1, "retries": 0, "failed": 1, "bytes": 0, "cache_hits": 0}
    s3.proxy(deny="/loose/n02102040")
    node = Fetch(ListFiles(url=f"{loose}/*/*.JPEG"), policy=PATIENT, on_error="skip")
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=r"n02102040_\w+\.JPEG: access denied .*AccessDenied"):
        list(node)  # never skipped: a denied source is not one bad sample
    assert node.stats()["retries"] == 0  # a retried denial would count 5 here
    assert time.monotonic() - t0 < 30  # (no retry loop of 30 s timeouts either)
    node.close()


def test_exhausted_retries_name_the_url_and_attempts_or_are_skipped(s3, loose) -> None:
    s3.proxy(fail_rate=1.0, max_failures=1000, faults=("503",), only="n03000684_")
    policy = RetryPolicy(attempts=3, timeout=1.0, backoff=0.01, backoff_max=0.02)
    node = Fetch(ListFiles(url=f"{loose}/*/*.JPEG"), policy=policy)
    with pytest.raises(SampleError, match=r"n03000684_\w+\.JPEG: failed after 3 attempt\(s\), the last "
                                          r"with .*SlowDown") as info:
        list(node)
    assert any("in fetch" in n for n in info.value.__notes__)
    node.close()
    skipping = Fetch(ListFiles(url=f"{loose}/*/*.JPEG"), policy=policy, on_error="skip")
    assert len(list(skipping)) == 40
    assert skipping.stats()["skipped"] == 20 and skipping.stats()["retries"] == 40
    skipping.close()


def test_a_server_that_never_answers_gives_an_error_within_the_timeouts(s3, loose) -> None:
    s3.proxy(hang="n01440764_10250")
    node = Fetch(ListFiles(url=f"{loose}/*/*.JPEG"),
                 policy=RetryPolicy(attempts=2, timeout=0.5, backoff=0.01, backoff_max=0.01))
    t0 = time.monotonic()
    with pytest.raises(SampleError, match=r"n01440764_10250\.JPEG: failed after 2 attempt\(s\).*Timeout"):
        list(node)
    # the proxy never answers that request: without the timeouts this would wait for ever (the
    # module's pytest timeout); the bound is wide, so a busy host (.ci/busy: 6 s) does not fail it
    assert time.monotonic() - t0 < 30
    node.close()


def test_a_server_gone_mid_epoch_is_a_source_error_after_the_retries_even_when_skipping(
        tmp_path: Path, monkeypatch) -> None:
    """Connection refused is about the server, not one object: with on_error: skip every
    sample left in the epoch was skipped, one failed retry loop after another."""
    server = MotoS3().start()
    running = True
    try:
        bucket = server.bucket()
        upload_dir(server.client(), SAMPLE / CLASSES[0], bucket, "gone")
        for k, v in aws_env(server.endpoint).items():
            monkeypatch.setenv(k, v)
        clear_fs_cache()
        node = Fetch(ListFiles(url=f"s3://{bucket}/gone/*.JPEG"), concurrency=2, on_error="skip", policy=QUICK)
        next(node)
        server.stop()
        running = False
        t0 = time.monotonic()
        with pytest.raises(SourceError, match=r"gone/n01440764_\w+\.JPEG: cannot reach the server, 6 "
                                              r"attempt\(s\).*check the endpoint") as info:
            list(node)
        assert time.monotonic() - t0 < 10
        assert any("in fetch" in note for note in info.value.__notes__)
        assert node.stats()["skipped"] == 0
        node.close()
    finally:
        if running:
            server.stop()
        clear_fs_cache()


def test_close_mid_epoch_cancels_reads_in_flight(s3, loose) -> None:
    s3.proxy(latency=0.2)
    node = Fetch(ListFiles(url=f"{loose}/*/*.JPEG"), concurrency=16, policy=QUICK)
    next(node)
    assert len(node._window) == 16
    node.close()
    assert not node._window


# ----- the policy itself, without a server ------------------------------------------------

def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def _wrapped(inner: Exception, outer: Exception) -> Exception:
    try:
        raise outer from inner
    except Exception as exc:  # the chain s3fs makes when it translates a ClientError
        return exc


def test_classify() -> None:
    import aiohttp
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError, ReadTimeoutError

    cases = {
        TRANSIENT: [_client_error("SlowDown", 503), _client_error("InternalError", 500),
                    _client_error("503", 503), _client_error("ThrottlingException", 400),
                    _wrapped(_client_error("ServiceUnavailable", 503), OSError(5, "x")),
                    ConnectionResetError(), TimeoutError(), asyncio.TimeoutError(),
                    aiohttp.ServerDisconnectedError(), aiohttp.ClientPayloadError("cut"),
                    ReadTimeoutError(endpoint_url="u"), EndpointConnectionError(endpoint_url="u")],
        NOT_FOUND: [_wrapped(_client_error("NoSuchKey", 404), FileNotFoundError("k")),
                    FileNotFoundError("x")],
        NO_BUCKET: [_wrapped(_client_error("NoSuchBucket", 404), FileNotFoundError("b"))],
        DENIED: [_client_error("AccessDenied", 403), PermissionError("p"),
                 _client_error("InvalidAccessKeyId", 403), NoCredentialsError()],
        PERMANENT: [ValueError("x"), _client_error("InvalidRange", 416)],
    }
    for kind, excs in cases.items():
        for exc in excs:
            assert classify(exc) == kind, (kind, exc)


def test_backoff_is_capped_exponential_with_jitter() -> None:
    policy = RetryPolicy(attempts=10, backoff=0.1, backoff_max=1.0)
    rng = random.Random(0)
    for retry in range(10):
        d = min(1.0, 0.1 * 2 ** retry)
        delays = [policy.delay(retry, rng) for _ in range(50)]
        assert all(d / 2 <= x <= d for x in delays) and len(set(delays)) > 1
    with pytest.raises(ValueError, match="attempts=0"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="backoff_max"):
        RetryPolicy(backoff=2, backoff_max=1)


def test_redact() -> None:
    opts = {"key": "AKIAEXAMPLE", "secret": "s3cr3t-value", "endpoint_url": "http://127.0.0.1:9",
            "client_kwargs": {"aws_session_token": "tok-123456"}}
    text = "s3cr3t-value AKIAEXAMPLE tok-123456 http://127.0.0.1:9 https://u:pw@host/x"
    assert redact(text, opts) == "*** *** *** http://127.0.0.1:9 https://u:***@host/x"


def test_fetch_keeps_order_fields_and_needs_a_url() -> None:
    files = sorted(str(p) for p in (SAMPLE / CLASSES[0]).glob("*.JPEG"))
    node = Fetch(IterableWrapper([{"path": f, "label": 3, "index": i} for i, f in enumerate(files)]),
                 concurrency=3, read_local=True)
    out = list(node)
    node.close()
    assert [o["path"] for o in out] == files and all(o["label"] == 3 for o in out)
    passing = Fetch(IterableWrapper([{"path": f} for f in files]))  # local paths: left to the decoder
    assert list(passing) == [{"path": f} for f in files]
    passing.close()
    assert [o["bytes"] for o in out] == [Path(f).read_bytes() for f in files]
    with pytest.raises(SampleError, match="expected a record with a URL under 'path'"):
        next(Fetch(IterableWrapper([{"file": "x"}])))
    with pytest.raises(ValueError, match="concurrency=0"):
        Fetch(IterableWrapper([]), concurrency=0)


def test_bad_retry_and_cache_params_are_spec_errors(tmp_path: Path) -> None:
    from conveyor import SpecErrors, check_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text("""nodes:
  files: {op: list_files, url: "x/*"}
  fetch: {op: fetch, timeout: 0, backoff: 2, backoff_max: 1, cache_size: lots}
  more:  {op: fetch, concurrency: 0}
  tars:  {op: read_tar, block_size: 100}
""")
    with pytest.raises(SpecErrors) as info:
        check_spec(spec)
    got = {(e.node, e.param) for e in info.value.errors}
    assert {("fetch", "timeout"), ("fetch", "backoff_max"), ("fetch", "cache_size"),
            ("more", "concurrency"), ("tars", "block_size")} <= got, info.value
