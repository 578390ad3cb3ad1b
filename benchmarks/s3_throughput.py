"""Object-storage throughput against a local S3 server (moto), with its own ceiling measured.

moto's server is one Python process: it, not conveyor, bounds the absolute numbers, so the
run first measures what the server itself delivers (GETs/s of the sample's objects and MB/s
of large ranged GETs, many requests in flight, straight to the server), then everything
else relative to it:

  * loose files through ``fetch`` with 30 ms added to every request (the loopback proxy of
    tests/s3_server.py standing in for real object storage), sweeping ``concurrency``;
    target: >= 0.8 x the server's no-latency GET ceiling (the latency fully hidden);
  * the full training pipeline (list -> fetch -> decode + crop, 2 threads -> batch) on local
    disk and on S3 + 30 ms; and the bundled specs/imagenet.yaml as it is (no fetch: decode
    threads read the objects themselves);
  * tar shards: read_tar alone and the full pipeline, local disk against S3 + 30 ms; target:
    >= 0.8 x local disk, or >= 0.8 x the server's byte ceiling where that is lower.

The server and the proxy run in their own processes (as a real store would); on 2 cores
they compete with the pipeline for the CPUs, which the table says next to the numbers.
Next to each number: the cores each process used meanwhile (client = this
process; ``others``: the rest of the machine, which should be near 0 for the numbers to
mean anything). Nothing but 127.0.0.1 is contacted. Each measurement is a pass over the data capped at
``--max-seconds``; the default run takes about 2 minutes.

    python benchmarks/s3_throughput.py
    python benchmarks/s3_throughput.py --copies 2 --max-seconds 3 --concurrency 1,8,32   # quicker
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from s3_server import aws_env, clear_fs_cache, upload_dir  # noqa: E402

SAMPLE = ROOT / "examples/data/imagenet-sample/train"

READ_SPEC = """\
nodes:
  files: {{op: list_files, url: "{root}/*/*.JPEG", label: parent_dir}}
  fetch: {{op: fetch, concurrency: {concurrency}}}
  batch: {{op: batch, size: 32}}
output: batch
"""
DECODE_SPEC = """\
nodes:
  files:  {{op: list_files, url: "{root}/*/*.JPEG", label: parent_dir, shuffle: true}}
  fetch:  {{op: fetch, concurrency: {concurrency}}}
  decode: {{op: map, fn: "conveyor.image:train_transform", args: {{size: 224}}, workers: 2}}
  batch:  {{op: batch, size: 32}}
  collate: {{op: collate}}
output: collate
"""
TAR_SPEC = """\
nodes:
  shards:  {{op: list_files, url: "{root}/*.tar"}}
  samples: {{op: read_tar, block_size: {block}, read_ahead: {ahead}}}
  batch:   {{op: batch, size: 32}}
output: batch
"""
TAR_DECODE_SPEC = """\
nodes:
  shards:  {{op: list_files, url: "{root}/*.tar", shuffle: true}}
  samples: {{op: read_tar, block_size: {block}, read_ahead: {ahead}}}
  decode:  {{op: map, fn: "conveyor.image:train_transform", args: {{size: 224}}, workers: 2}}
  batch:   {{op: batch, size: 32}}
  collate: {{op: collate}}
output: collate
"""


class _Child:
    """tests/s3_server.py in its own process; stopped by closing its stdin (or killed)."""

    def __init__(self, name: str, *args: str):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests/s3_server.py"), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"tests/s3_server.py {' '.join(args)} did not start: {line!r}")
        self.endpoint = f"http://127.0.0.1:{int(line.split()[1])}"
        _CHILDREN.append(self)

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)


def _use(endpoint: str) -> None:
    os.environ.update(aws_env(endpoint))
    clear_fs_cache()


_CHILDREN: list["_Child"] = []


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by this process and by each server process."""
    tick = os.sysconf("SC_CLK_TCK")
    t = os.times()
    out = {"client": t.user + t.system}
    for child in _CHILDREN:
        try:
            with open(f"/proc/{child.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[child.name] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:  # not on Linux, or gone
            pass
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # minus idle, iowait
        out["machine"] = busy / tick
    except OSError:  # not on Linux
        pass
    return out


def _spent(cpu0: dict[str, float], cpu1: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores used per process over ``seconds``; ``others`` is the rest of the machine."""
    cores = {k: (cpu1[k] - cpu0.get(k, 0.0)) / seconds for k in cpu1 if k != "machine"}
    if "machine" in cpu1:
        cores["others"] = max(0.0, (cpu1["machine"] - cpu0["machine"]) / seconds - sum(cores.values()))
    return cores


def run_spec(text: str, tmp: Path, max_seconds: float, bytes_per_item: float = 0.0) -> dict[str, Any]:
    """Items/s (and MB/s) of a spec, epoch after epoch until ``max_seconds``, and the cores
    each process used meanwhile."""
    from conveyor import load_graph
    from conveyor.tools.measure import batch_len

    spec = tmp / "bench.yaml"
    spec.write_text(text)
    with load_graph(spec) as loader:
        cpu0 = _cpu_seconds()
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < max_seconds:
            for batch in loader:
                n += batch_len(batch)
                if time.perf_counter() - t0 > max_seconds:
                    break
        dt = time.perf_counter() - t0
        cpu1 = _cpu_seconds()
        stats = loader.stats()["nodes"]
    retries = sum(v.get("retries", 0) for v in stats.values())
    cores = _spent(cpu0, cpu1, dt)
    return {"items": n, "seconds": dt, "rate": n / dt, "mbs": n * bytes_per_item / dt / 1e6,
            "retries": retries, "cores": cores}


def _cores(r: dict[str, Any]) -> str:
    return "cores " + " ".join(f"{k} {v:.2f}" for k, v in r["cores"].items() if v >= 0.05)


def ceiling_gets(bucket: str, keys: list[str], concurrency: int, max_seconds: float) -> dict[str, float]:
    """GETs/s of whole objects, ``concurrency`` in flight, no pipeline around them."""
    from conveyor.storage import RetryPolicy, Storage

    st = Storage(policy=RetryPolicy(attempts=3, timeout=30))
    t0 = time.perf_counter()
    n = nbytes = 0
    futures = []
    it = iter(keys * 100)
    for _ in range(concurrency):
        futures.append(st.submit(f"s3://{bucket}/{next(it)}"))
    while time.perf_counter() - t0 < max_seconds and n < len(keys) * 2:
        data = futures.pop(0).result()
        n += 1
        nbytes += len(data)
        futures.append(st.submit(f"s3://{bucket}/{next(it)}"))
    dt = time.perf_counter() - t0
    for f in futures:
        f.cancel()
    st.close()
    return {"rate": n / dt, "mbs": nbytes / dt / 1e6}


def ceiling_bytes(urls: list[str], block: int, concurrency: int, max_seconds: float) -> float:
    """MB/s of ranged GETs of ``block`` bytes over the shards, ``concurrency`` in flight."""
    from conveyor.storage import RetryPolicy, Storage

    st = Storage(policy=RetryPolicy(attempts=3, timeout=60))
    ranges = []
    for url in urls:
        size = st.size(url)
        ranges += [(url, s, min(s + block, size)) for s in range(0, size, block)]
    ranges = ranges * 10
    t0 = time.perf_counter()
    nbytes = 0
    pending = [st.submit(*r) for r in ranges[:concurrency]]
    i = concurrency
    while pending and time.perf_counter() - t0 < max_seconds:
        nbytes += len(pending.pop(0).result())
        if i < len(ranges):
            pending.append(st.submit(*ranges[i]))
            i += 1
    dt = time.perf_counter() - t0
    for f in pending:
        f.cancel()
    st.close()
    return nbytes / dt / 1e6


def wait_for_quiet(max_wait: float, busy: float = 0.3) -> float:
    """Wait (up to ``max_wait`` s) until other processes use less than ``busy`` cores; returns
    what they used in the last 2 s window."""
    deadline = time.monotonic() + max_wait
    while True:
        cpu0 = _cpu_seconds()
        time.sleep(2.0)
        others = _spent(cpu0, _cpu_seconds(), 2.0).get("others", 0.0)
        if others < busy or time.monotonic() > deadline:
            return others
        print(f"  waiting for a quiet machine: other processes use {others:.1f} cores", flush=True)


def make_data(tmp: Path, copies: int, shard_size: str, shard_copies: int = 1) -> tuple[Path, Path, int, float]:
    """``copies`` copies of the bundled sample as loose files, and packed as shards (those
    ``shard_copies`` times over)."""
    from conveyor.pack import pack

    loose = tmp / "loose"
    for cls in sorted(p for p in SAMPLE.iterdir() if p.is_dir()):
        (loose / cls.name).mkdir(parents=True)
        for f in sorted(cls.glob("*.JPEG")):
            for c in range(copies):
                shutil.copyfile(f, loose / cls.name / f"c{c}{f.name}")
    files = list(loose.glob("*/*.JPEG"))
    packed = tmp / "packed"
    pack(str(loose), str(packed), shard_size=shard_size)
    shards = tmp / "shards"  # the shards several times over: more bytes per epoch restart
    shards.mkdir()
    for k in range(shard_copies):
        for p in sorted(packed.glob("*.tar")):
            shutil.copyfile(p, shards / f"{p.stem}-{k}.tar")
    return loose, shards, len(files), sum(f.stat().st_size for f in files) / len(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of the 200-image sample (default 4)")
    parser.add_argument("--latency", type=float, default=0.030, help="seconds added per request (default 0.03)")
    parser.add_argument("--concurrency", default="1,8,32,64,128", help="fetch concurrency sweep")
    parser.add_argument("--pipeline-concurrency", type=int, default=32)
    parser.add_argument("--shard-size", default="64MB")
    parser.add_argument("--shard-copies", type=int, default=6, help="each shard uploaded this many times")
    parser.add_argument("--block", default="8MB", help="read_tar block_size")
    parser.add_argument("--read-ahead", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=6.0, help="cap on each measurement")
    parser.add_argument("--quiet-wait", type=float, default=0.0,
                        help="first wait up to this many seconds for other processes to go quiet")
    args = parser.parse_args(argv)
    sweep = [int(c) for c in args.concurrency.split(",")]
    from conveyor.storage import parse_size

    block = parse_size(args.block)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="s3bench-"))
    moto = proxy0 = proxy = None
    rows: list[tuple[str, str, str, str]] = []

    def row(name: str, where: str, rate: float, unit: str, extra: str = "",
            r: dict[str, Any] | None = None) -> None:
        if r is not None:
            extra = f"{extra}; {_cores(r)}" if extra else _cores(r)
        rows.append((name, where, f"{rate:,.0f} {unit}", extra))
        print(f"  {name:<38} {where:<11} {rate:>9,.1f} {unit:<10} {extra}", flush=True)

    try:
        loose, shards, n_files, avg = make_data(tmp, args.copies, args.shard_size, args.shard_copies)
        shard_bytes = sum(p.stat().st_size for p in shards.glob("*.tar")) / args.shard_copies
        print(f"data: {n_files} JPEGs, {avg / 1e3:.1f} kB average; {len(list(shards.glob('*.tar')))} "
              f"shards of up to {args.shard_size} ({args.shard_copies} copies of each); "
              f"{os.cpu_count()} CPUs", flush=True)
        if args.quiet_wait > 0:
            others = wait_for_quiet(args.quiet_wait)
            print(f"other processes: {others:.2f} cores at the start", flush=True)
        moto = _Child("server", "moto")
        proxy0 = _Child("proxy0", "proxy", "--upstream", moto.endpoint)
        proxy = _Child("proxy", "proxy", "--upstream", moto.endpoint, "--latency", str(args.latency))
        _use(moto.endpoint)
        import boto3

        client = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        upload_dir(client, loose, "bench", "loose")
        upload_dir(client, shards, "bench", "shards")
        keys = sorted(f"loose/{p.relative_to(loose).as_posix()}" for p in loose.glob("*/*.JPEG"))
        s3_loose, s3_shards = "s3://bench/loose", "s3://bench/shards"
        lat = f"S3+{args.latency * 1e3:.0f}ms"

        print("\nserver ceiling (no latency, straight to moto, no pipeline):")
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        best = max((ceiling_gets("bench", keys, c, args.max_seconds / 2) for c in (16, 64)),
                   key=lambda r: r["rate"])
        get_ceiling = best["rate"]
        row("GET whole objects", "S3", get_ceiling, "GET/s", f"{best['mbs']:.1f} MB/s",
            {"cores": _spent(cpu0, _cpu_seconds(), time.perf_counter() - t0)})
        urls = [f"{s3_shards}/{p.name}" for p in sorted(shards.glob("*.tar"))]
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        byte_ceiling = max(ceiling_bytes(urls, block, c, args.max_seconds / 2) for c in (2, 8))
        row(f"ranged GET of {args.block}", "S3", byte_ceiling, "MB/s", "",
            {"cores": _spent(cpu0, _cpu_seconds(), time.perf_counter() - t0)})

        print("\nloose files, fetch only (list -> fetch -> batch):")
        local_read = run_spec(READ_SPEC.format(root=loose, concurrency=16), tmp, args.max_seconds, avg)
        row("fetch c=16", "local disk", local_read["rate"], "obj/s", f"{local_read['mbs']:.1f} MB/s",
            local_read)
        r = run_spec(READ_SPEC.format(root=s3_loose, concurrency=16), tmp, args.max_seconds, avg)
        row("fetch c=16", "S3", r["rate"], "obj/s", f"{r['rate'] / get_ceiling:.2f} x ceiling", r)
        _use(proxy0.endpoint)
        r = run_spec(READ_SPEC.format(root=s3_loose, concurrency=16), tmp, args.max_seconds, avg)
        row("fetch c=16 (through the proxy, 0 ms)", "S3+proxy", r["rate"], "obj/s",
            f"{r['rate'] / get_ceiling:.2f} x ceiling", r)
        _use(proxy.endpoint)
        sweep_rates = {}
        for c in sweep:
            r = run_spec(READ_SPEC.format(root=s3_loose, concurrency=c), tmp, args.max_seconds, avg)
            sweep_rates[c] = r["rate"]
            row(f"fetch c={c}", lat, r["rate"], "obj/s", f"{r['rate'] / get_ceiling:.2f} x ceiling", r)

        print("\nloose files, full pipeline (list -> fetch -> train_transform 224, 2 threads -> batch):")
        _use(moto.endpoint)
        local_dec = run_spec(DECODE_SPEC.format(root=loose, concurrency=args.pipeline_concurrency),
                             tmp, args.max_seconds)
        row("imagenet + fetch", "local disk", local_dec["rate"], "img/s", "", local_dec)
        _use(proxy.endpoint)
        s3_dec = run_spec(DECODE_SPEC.format(root=s3_loose, concurrency=args.pipeline_concurrency),
                          tmp, args.max_seconds)
        row(f"imagenet + fetch c={args.pipeline_concurrency}", lat, s3_dec["rate"], "img/s",
            f"{s3_dec['rate'] / local_dec['rate']:.2f} x local, {s3_dec['rate'] / get_ceiling:.2f} x ceiling",
            s3_dec)
        from conveyor import load_graph

        with load_graph(ROOT / "specs/imagenet.yaml", root=s3_loose, batch_size=32) as loader:
            cpu0, t0, n = _cpu_seconds(), time.perf_counter(), 0
            for b in loader:
                n += len(b["label"])
                if time.perf_counter() - t0 > args.max_seconds:
                    break
            dt = time.perf_counter() - t0
            plain = n / dt
        row("specs/imagenet.yaml as is (no fetch)", lat, plain, "img/s",
            f"{plain / local_dec['rate']:.2f} x local", {"cores": _spent(cpu0, _cpu_seconds(), dt)})

        print("\ntar shards (list -> read_tar -> batch, then + train_transform):")
        _use(moto.endpoint)
        per_sample = shard_bytes / n_files
        local_tar = run_spec(TAR_SPEC.format(root=shards, block=block, ahead=args.read_ahead), tmp,
                             args.max_seconds, per_sample)
        row("read_tar", "local disk", local_tar["rate"], "samples/s", f"{local_tar['mbs']:.1f} MB/s",
            local_tar)
        s3_tar0 = run_spec(TAR_SPEC.format(root=s3_shards, block=block, ahead=args.read_ahead), tmp,
                           args.max_seconds, per_sample)
        row("read_tar", "S3", s3_tar0["rate"], "samples/s", f"{s3_tar0['mbs']:.1f} MB/s", s3_tar0)
        _use(proxy.endpoint)
        s3_tar = run_spec(TAR_SPEC.format(root=s3_shards, block=block, ahead=args.read_ahead), tmp,
                          args.max_seconds, per_sample)
        row("read_tar", lat, s3_tar["rate"], "samples/s",
            f"{s3_tar['mbs']:.1f} MB/s = {s3_tar['mbs'] / byte_ceiling:.2f} x byte ceiling", s3_tar)
        _use(moto.endpoint)
        local_tdec = run_spec(TAR_DECODE_SPEC.format(root=shards, block=block, ahead=args.read_ahead),
                              tmp, args.max_seconds)
        row("read_tar + decode", "local disk", local_tdec["rate"], "img/s", "", local_tdec)
        _use(proxy.endpoint)
        s3_tdec = run_spec(TAR_DECODE_SPEC.format(root=s3_shards, block=block, ahead=args.read_ahead),
                           tmp, args.max_seconds)
        row("read_tar + decode", lat, s3_tdec["rate"], "img/s",
            f"{s3_tdec['rate'] / local_tdec['rate']:.2f} x local", s3_tdec)

        best_c = max(sweep_rates, key=sweep_rates.get)
        loose_ratio = sweep_rates[best_c] / get_ceiling
        tar_vs_local = s3_tdec["rate"] / local_tdec["rate"]
        tar_bytes_needed = local_tdec["rate"] * per_sample / 1e6
        print("\nsummary")
        print(f"  loose, {lat}, fetch c={best_c}: {sweep_rates[best_c]:,.0f} obj/s = {loose_ratio:.2f} x the "
              f"server's GET ceiling {get_ceiling:,.0f}/s (target >= 0.8: "
              f"{'met' if loose_ratio >= 0.8 else 'NOT met'})")
        limit = ("local disk" if tar_bytes_needed <= byte_ceiling else
                 f"the server's byte ceiling ({byte_ceiling:.0f} MB/s < {tar_bytes_needed:.0f} MB/s needed)")
        target = local_tdec["rate"] if tar_bytes_needed <= byte_ceiling else byte_ceiling * 1e6 / per_sample
        print(f"  shards, {lat}, with decode: {s3_tdec['rate']:,.0f} img/s = {tar_vs_local:.2f} x local disk "
              f"({local_tdec['rate']:,.0f} img/s); the limit that applies: {limit}; target >= 0.8 x "
              f"{target:,.0f}: {'met' if s3_tdec['rate'] >= 0.8 * target else 'NOT met'}")
        print(f"  shards, {lat}, read only: {s3_tar['mbs']:.1f} MB/s = {s3_tar['mbs'] / byte_ceiling:.2f} x "
              f"byte ceiling, {s3_tar['rate'] / local_tar['rate']:.2f} x local read_tar")
        print(f"  total time {time.perf_counter() - t_start:.0f} s")
    finally:
        for child in (proxy, proxy0, moto):
            if child is not None:
                child.stop()
        clear_fs_cache()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
