"""The contract every node keeps, checked the same way for each (fsspec's shared test classes
and Grain's resume-from-every-step test, applied to our nodes as plain torchdata nodes):

- reset twice gives the same epoch; ``state_dict()`` before the first ``next`` restores the
  whole epoch; ``close()`` twice is fine;
- the state after every step of two epochs (a spread of steps for long epochs), after a JSON
  round trip, restores into a freshly built node exactly the rest of that epoch;
- the state has the same shape at every step.
"""

from __future__ import annotations

import functools

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torchdata.nodes import BaseNode, IterableWrapper

from conveyor.files import read_numbers
from conveyor.nodes.batch import Batch
from conveyor.nodes.collate import Collate
from conveyor.nodes.copies import WorkerCopies
from conveyor.nodes.filter import Filter
from conveyor.nodes.list_files import ListFiles
from conveyor.nodes.map import Map
from conveyor.nodes.mix import Mix
from conveyor.nodes.pin_memory import PinMemory
from conveyor.nodes.prefetch import Prefetch
from conveyor.nodes.shard import Shard
from conveyor.nodes.shuffle_buffer import ShuffleBuffer
from conveyor.nodes.to_device import ToDevice
from resume_check import fingerprint

ROOT = Path(__file__).resolve().parent.parent
NUMBERS = str(ROOT / "examples/data/numbers/*/*.txt")
TEXT = str(ROOT / "examples/data/text-sample/*.jsonl")


def _files(**kw: Any) -> ListFiles:
    return ListFiles(url=NUMBERS, label="parent_dir", **kw)


def _noisy(item: dict, *, rng) -> dict:
    return {"index": item["index"], "noise": rng.random()}


def _copy(w: int) -> tuple[BaseNode, dict]:
    """A copy for WorkerCopies: module-level so that it pickles."""
    src = Shard(ListFiles(url=NUMBERS, shuffle=True), rank=0, world=1, worker=w, workers=2)
    node = Map(src, fn=read_numbers)
    return node, {"src": src, "map": node}


def _text_chain() -> BaseNode:
    from conveyor.nodes.bucket_batch import BucketBatch
    from conveyor.nodes.pad_collate import PadCollate
    from conveyor.nodes.read_jsonl import ReadJsonl
    from conveyor.text import byte_tokenize

    read = ReadJsonl(ListFiles(url=TEXT), field="text")
    tok = Map(read, fn=byte_tokenize, args={"max_length": 256})
    bb = BucketBatch(tok, length="input_ids", boundaries=[64, 128, 256], max_tokens=2048, pool=2)
    return PadCollate(bb, fields=["input_ids"])


def _map_batches(source: BaseNode, **kw: Any) -> BaseNode:
    from conveyor.nodes.map_batches import MapBatches

    return MapBatches(Map(source, fn=lambda r: r["index"]), fn=_tens, **kw)


def _text_chain_batched() -> BaseNode:
    from conveyor.nodes.bucket_batch import BucketBatch
    from conveyor.nodes.map_batches import MapBatches
    from conveyor.nodes.pad_collate import PadCollate
    from conveyor.nodes.read_jsonl import ReadJsonl
    from conveyor.text import byte_tokenize

    one_file = TEXT.replace("*.jsonl", "part-0001.jsonl")
    read = ShuffleBuffer(ReadJsonl(ListFiles(url=one_file), field="text"), size=50, seed=2)
    tok = MapBatches(read, fn=byte_tokenize, size=7, args={"max_length": 256})
    bb = BucketBatch(tok, length="input_ids", boundaries=[64, 128, 256], max_tokens=2048, pool=2)
    return PadCollate(bb, fields=["input_ids"])


def _packed(algorithm: str) -> BaseNode:
    """One file of the text sample, shuffled, byte-tokenized and packed (a short last pool)."""
    from conveyor.nodes.map_batches import MapBatches
    from conveyor.nodes.pack_tokens import PackTokens
    from conveyor.nodes.read_jsonl import ReadJsonl
    from conveyor.text import byte_tokenize

    one_file = TEXT.replace("*.jsonl", "part-0001.jsonl")
    read = ShuffleBuffer(ReadJsonl(ListFiles(url=one_file), field="text"), size=50, seed=2)
    tok = MapBatches(read, fn=byte_tokenize, size=16, args={"dtype": "uint8"})
    return PackTokens(tok, seq_len=512, algorithm=algorithm, pool=300, seed=4)


def _tens(items: list) -> list:
    return [x * 10 for x in items]


_SHARDS: list[str] = []


def _shards() -> str:
    """The number files packed as small tar shards, once per session (about 3 samples each)."""
    if not _SHARDS:
        import tempfile

        from conveyor.pack import pack

        out = tempfile.mkdtemp(prefix="contract-shards-")
        pack(str(ROOT / "examples/data/numbers"), out, shard_size="8kB")
        _SHARDS.append(out)
    return _SHARDS[0] + "/*.tar"


_TABLES: list[str] = []


def _tables() -> str:
    """Two small Parquet files (row groups of 5) and an LMDB of the number files, once."""
    if not _TABLES:
        import tempfile

        import pyarrow as pa
        import pyarrow.parquet as pq

        from conveyor.pack import pack_lmdb

        out = tempfile.mkdtemp(prefix="contract-tables-")
        for f, n in (("a", 13), ("b", 8)):
            pq.write_table(pa.table({"x": [f"{f}{i}" for i in range(n)]}), f"{out}/{f}.parquet", row_group_size=5)
        pack_lmdb(str(ROOT / "examples/data/numbers"), f"{out}/numbers.lmdb")
        _TABLES.append(out)
    return _TABLES[0]


def _read_parquet() -> BaseNode:
    from conveyor.nodes.read_parquet import ReadParquet

    return ReadParquet(ListFiles(url=_tables() + "/*.parquet", shuffle=True), batch_rows=3)


def _read_lmdb() -> BaseNode:
    from conveyor.nodes.list_lmdb import ListLmdb
    from conveyor.nodes.read_lmdb import ReadLmdb

    return ReadLmdb(ShuffleBuffer(ListLmdb(path=_tables() + "/numbers.lmdb", label="parent_dir", shuffle=True),
                                  size=4))


def _read_samples(kind: str) -> BaseNode:
    from conveyor.nodes import ListLitdata, ListMds, ReadSamples

    fix = Path(__file__).resolve().parent / "fixtures/formats"
    lister = ListMds(url=str(fix / "mds/zstd"), shuffle=True) if kind == "mds" else \
        ListLitdata(url=str(fix / "litdata/plain"), shuffle=True)
    from conveyor.nodes import Map

    read = ReadSamples(ShuffleBuffer(lister, size=4), allow_pickle=True)
    return Map(read, fn=_comparable)  # arrays do not compare with ==


def _comparable(sample: dict) -> tuple:
    return sample["index"], sample["name"], sample["label"], sample["__url__"]


def _read_tar(**kw: Any) -> BaseNode:
    from conveyor.nodes.read_tar import ReadTar

    return ReadTar(ListFiles(url=_shards(), shuffle=True), **kw)


def _fetch(**kw: Any) -> BaseNode:
    from conveyor.nodes.fetch import Fetch

    return Fetch(ShuffleBuffer(_files(), size=5), read_local=True, **kw)


# name -> factory building a fresh chain (each call must build new nodes)
CHAINS: dict[str, Callable[[], BaseNode]] = {
    "list_files": lambda: _files(shuffle=True),
    "shard": lambda: Shard(_files(), rank=1, world=3),
    "shard_drop": lambda: Shard(_files(), rank=2, world=3, equalize="drop"),
    "shuffle_buffer": lambda: ShuffleBuffer(_files(), size=7, seed=3),
    "map_inline_rng": lambda: Map(_files(), fn=_noisy, seed=1),
    "map_threads": lambda: Map(ShuffleBuffer(_files(), size=5), fn=read_numbers, workers=2),
    "map_threads_sparse_snapshots": lambda: Map(_files(), fn=_noisy, workers=2, snapshot_every=7),
    "filter": lambda: Filter(_files(), fn=lambda r: r["index"] % 3 != 0),
    "batch": lambda: Batch(_files(), size=6),
    "collate": lambda: Collate(Batch(Map(_files(), fn=read_numbers), size=6)),
    "pin_memory": lambda: PinMemory(Batch(_files(), size=4)),
    "prefetch": lambda: Prefetch(Map(_files(shuffle=True), fn=read_numbers, workers=2), depth=3),
    "mix_all": lambda: Mix([_files(shuffle=True), IterableWrapper(range(100, 107))], weights=[2, 1]),
    "mix_first": lambda: Mix([ShuffleBuffer(_files(), size=4), _files()], weights=[1, 3], stop="first"),
    "to_device_cpu": lambda: ToDevice(Batch(_files(), size=4), device="cpu"),
    "worker_copies_threads": lambda: WorkerCopies(_copy, copies=2, method="thread"),
    "text_chain": _text_chain,
    "text_chain_map_batches": _text_chain_batched,
    "pack_tokens_best_fit": lambda: _packed("best_fit"),
    "pack_tokens_first_fit": lambda: Batch(_packed("first_fit"), size=3),
    "map_batches_inline": lambda: _map_batches(ShuffleBuffer(_files(), size=5), size=3),
    "map_batches_threads": lambda: _map_batches(_files(), size=4, workers=2),
    "fetch": lambda: _fetch(concurrency=4),
    "fetch_then_map_threads": lambda: Map(_fetch(concurrency=3), fn=read_numbers, workers=2),
    "read_tar": lambda: _read_tar(),
    "read_tar_then_shuffle": lambda: ShuffleBuffer(_read_tar(), size=4),
    "read_parquet": _read_parquet,
    "list_lmdb_read_lmdb": _read_lmdb,
    "list_mds_read_samples": functools.partial(_read_samples, "mds"),
    "list_litdata_read_samples": functools.partial(_read_samples, "litdata"),
}


def _nodes(root: BaseNode) -> list[BaseNode]:
    out, todo = [], [root]
    while todo:
        node = todo.pop()
        out.append(node)
        for attr in ("source", "sources", "inner"):
            child = getattr(node, attr, None)
            if isinstance(child, BaseNode):
                todo.append(child)
            elif isinstance(child, list):
                todo.extend(c for c in child if isinstance(c, BaseNode))
    return out


def _epoch(root: BaseNode, epoch: int, state: dict | None = None, states: list | None = None) -> list:
    for node in _nodes(root):
        if callable(getattr(node, "set_epoch", None)):
            node.set_epoch(epoch)
    root.reset(state)
    out = []
    if states is not None:
        states.append(json.loads(json.dumps(root.state_dict())))
    for item in root:
        out.append(fingerprint(item))
        if states is not None:
            states.append(json.loads(json.dumps(root.state_dict())))
    return out


def _steps(n: int, limit: int = 45) -> list[int]:
    """Every step of small epochs; for long ones the first and last ten and a spread between."""
    if n <= limit:
        return list(range(n))
    return sorted(set(range(10)) | set(range(n - 10, n)) | set(range(10, n - 10, (n - 20) // 15)))


def _close(root: BaseNode) -> None:
    for node in _nodes(root):
        if callable(getattr(node, "close", None)):
            node.close()
            node.close()  # twice is fine


def _shape(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return "list"
    return type(obj).__name__ if obj is not None else "null"


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_node_contract(name: str) -> None:
    make = CHAINS[name]
    root = make()
    try:
        states: dict[int, list] = {0: [], 1: []}
        epochs = [_epoch(root, e, states=states[e]) for e in (0, 1)]
        assert epochs[0], "an empty epoch proves nothing"
        assert _epoch(root, 0) == epochs[0], "reset twice must give the same epoch"
        assert len({json.dumps(_shape(s), sort_keys=True) for e in (0, 1) for s in states[e]}) == 1, \
            "the state must keep its shape from step to step"
    finally:
        _close(root)
    for e in (0, 1):
        for k in _steps(len(states[e])):
            state = states[e][k]
            fresh = make()
            try:
                assert _epoch(fresh, e, state=state) == epochs[e][k:], f"epoch {e}, resumed at step {k}"
            finally:
                _close(fresh)
