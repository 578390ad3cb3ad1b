"""LIST requests per rank for 4 ranks x 2 epochs of a list_files over S3 (moto on 127.0.0.1):
every rank lists for itself (before), rank 0 lists and the others read its listing from the
store (share: rank0, the default for remote URLs), and a manifest (conveyor index) read with
one GET (issue 31 item 4).

    python benchmarks/listing_requests.py [--objects 3000]

Ranks are threads, each with its own TCPStore client of one server on 127.0.0.1, each a
``ListFiles`` kept for its loader's two epochs (reset each epoch, as the loader does); a
``conveyor`` loader of a spec over the same bucket, two epochs, shows what one rank of a real
run lists. Requests are counted by a pass-through proxy in front of moto.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch.distributed as dist  # noqa: E402

from s3_server import FaultProxy, MotoS3, aws_env, clear_fs_cache, free_port  # noqa: E402

from conveyor import load_graph  # noqa: E402
from conveyor.graphs.listings import listing_sharer  # noqa: E402
from conveyor.nodes import ListFiles, write_manifest  # noqa: E402

WORLD, EPOCHS = 4, 2


def _ranks(make) -> None:
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            node = make(r)
            for epoch in range(EPOCHS):
                node.set_epoch(epoch)
                node.reset()
                sum(1 for _ in node)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=3000, help="objects in the bucket (1000 a LIST page)")
    args = ap.parse_args()
    server = MotoS3().start()
    proxy = FaultProxy(server.endpoint).start()
    try:
        os.environ.update(aws_env(proxy.endpoint))
        clear_fs_cache()
        client = server.client()
        bucket = server.bucket("listing")

        def put(i: int) -> None:
            client.put_object(Bucket=bucket, Key=f"train/c{i % 10}/{i:07d}.jpg", Body=b"x")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(args.objects)))
        url = f"s3://{bucket}/train/*/*.jpg"
        rows = []

        def count(label: str, run) -> None:
            before = dict(proxy.kinds)
            run()
            lists = proxy.kinds.get("list", 0) - before.get("list", 0)
            gets = proxy.kinds.get("get", 0) - before.get("get", 0)
            rows.append((label, lists, gets))

        def one_loader(workers: str = "") -> None:
            with tempfile.TemporaryDirectory() as tmp:
                spec = Path(tmp) / "spec.yaml"
                spec.write_text(f"nodes:\n  files: {{op: list_files, url: \"{url}\"}}\n"
                                "  shard: {op: shard, by: [rank, worker]}\n"
                                f"  batch: {{op: batch, size: 100}}\noutput: batch\n{workers}")
                loader = load_graph(str(spec))
                for epoch in range(EPOCHS):
                    loader.set_epoch(epoch) if hasattr(loader, "set_epoch") else None
                    sum(1 for _ in loader)
                loader.close() if hasattr(loader, "close") else None

        count("one rank's conveyor loader, 2 epochs (world 1)", one_loader)
        count("the same with workers: {copies: 2, method: process}",
              lambda: one_loader("workers: {copies: 2, method: process}\n"))
        count("4 ranks, each lists (share: each; before)", lambda: _ranks(lambda r: ListFiles(url=url)))
        port = free_port()
        server_store = dist.TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=60))
        clients = {r: dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=60))
                    for r in range(WORLD)}
        count("4 ranks, rank 0 lists (share: rank0; after)", lambda: _ranks(lambda r: ListFiles(
            url=url, share=listing_sharer(url, rank=r, world=WORLD, timeout=60, store=lambda: clients[r]))))
        with tempfile.TemporaryDirectory() as tmp:
            manifest = Path(tmp) / "train.json"
            count("conveyor index (once, for the manifest)",
                  lambda: manifest.write_text(json.dumps(write_manifest(url))))
            client.put_object(Bucket=bucket, Key="manifests/train.json", Body=manifest.read_bytes())
        murl = f"s3://{bucket}/manifests/train.json"
        count("4 ranks, list_files manifest: (after)", lambda: _ranks(lambda r: ListFiles(manifest=murl)))
        del server_store
        print(f"{args.objects} objects, {WORLD} ranks x {EPOCHS} epochs; requests counted at a proxy before moto\n")
        print("| run | LIST requests (all ranks) | mean per rank | GET requests |")
        print("|---|---:|---:|---:|")
        for label, lists, gets in rows:
            ranks = WORLD if label.startswith("4 ranks") else 1
            print(f"| {label} | {lists} | {lists / ranks:g} | {gets} |")
    finally:
        proxy.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
