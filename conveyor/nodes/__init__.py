"""conveyor's ops as plain torchdata ``BaseNode``s, usable from Python without a spec.

One op a module (``map.py`` is ``op: map``), each a node with the torchdata contract
(``reset(initial_state)``, ``next()``, ``get_state()``); what a node may offer beyond that
(``set_epoch``, ``stats``, ``close``, a skip ledger, elastic resume...) is declared in
``capabilities``. The names below are what the rest of conveyor (the compiler, the Loader,
the tools) may import from here: the node classes, and the few helpers the compiler checks
params with or the Loader resumes and reports with.

Private modules: ``_workers/`` (threads, worker processes and what passes between them:
map's engines, copies' workers, pipes, shared-memory slots, batch slabs) and the helpers of
single ops (``_tar``, ``_lmdb``) or of many (``_rng`` seeds, ``_skips`` the skip ledger,
``_elastic`` elastic resume, ``_configured`` transform classes made once per worker).

Example:
    >>> from torchdata.nodes import IterableWrapper
    >>> from conveyor.nodes import Batch, Map
    >>> list(Batch(Map(IterableWrapper(range(5)), fn=lambda x: x * 10), size=2))
    [[0, 10], [20, 30], [40]]
"""

from conveyor.nodes import capabilities, state_shape
from conveyor.nodes._configured import PerWorker
from conveyor.nodes._elastic import Cursor, deal_end, encode_bits, remaining, slot_items
from conveyor.nodes._lmdb import lmdb_module
from conveyor.nodes._skips import LEDGER_KEY, SkipLedger, gather, ledgers
from conveyor.nodes._workers.torchdata_threads import join_threads
from conveyor.nodes.batch import Batch
from conveyor.nodes.bucket_batch import DEFAULT_POOL, BucketBatch
from conveyor.nodes.capabilities import pull
from conveyor.nodes.collate import Collate
from conveyor.nodes.copies import WorkerCopies
from conveyor.nodes.dataset import DatasetSampler, bad_weight
from conveyor.nodes.fetch import Fetch
from conveyor.nodes.filter import Filter
from conveyor.nodes.synthetic import Synthetic
from conveyor.nodes.iterable import IterableSource
from conveyor.nodes.list_files import (ListFiles, below, changed_since_manifest, number_classes, read_manifest,
                                      suffixes, with_suffix, write_manifest)
from conveyor.nodes.list_lmdb import ListLmdb
from conveyor.nodes.list_samples import ListLitdata, ListMds
from conveyor.nodes.map import Map
from conveyor.nodes.map_batches import MapBatches, wants_rng
from conveyor.nodes.mix import Mix, weights_problem
from conveyor.nodes.pack_tokens import PackTokens
from conveyor.nodes.pad_collate import PadCollate, check_dtype
from conveyor.nodes.pin_memory import PinMemory
from conveyor.nodes.prefetch import Prefetch
from conveyor.nodes.read_jsonl import ReadJsonl, encoding_problem
from conveyor.nodes.read_lmdb import ReadLmdb
from conveyor.nodes.read_parquet import ReadParquet, parquet_schema
from conveyor.nodes.read_samples import ReadSamples
from conveyor.nodes.read_tar import ReadTar
from conveyor.nodes.shard import Shard, count_items, dist_rank_world
from conveyor.nodes.shuffle_buffer import ShuffleBuffer
from conveyor.nodes.state_shape import check_state
from conveyor.nodes.to_device import ToDevice

__all__ = [
    "Batch",
    "BucketBatch",
    "Collate",
    "Cursor",
    "DEFAULT_POOL",
    "DatasetSampler",
    "Fetch",
    "Filter",
    "IterableSource",
    "LEDGER_KEY",
    "ListFiles",
    "ListLitdata",
    "ListLmdb",
    "ListMds",
    "Map",
    "MapBatches",
    "Mix",
    "PackTokens",
    "PadCollate",
    "PerWorker",
    "PinMemory",
    "Prefetch",
    "ReadJsonl",
    "ReadLmdb",
    "ReadParquet",
    "ReadSamples",
    "ReadTar",
    "Shard",
    "ShuffleBuffer",
    "SkipLedger",
    "Synthetic",
    "ToDevice",
    "WorkerCopies",
    "bad_weight",
    "below",
    "capabilities",
    "changed_since_manifest",
    "check_dtype",
    "check_state",
    "count_items",
    "deal_end",
    "dist_rank_world",
    "encode_bits",
    "encoding_problem",
    "gather",
    "join_threads",
    "ledgers",
    "lmdb_module",
    "number_classes",
    "parquet_schema",
    "pull",
    "read_manifest",
    "remaining",
    "slot_items",
    "state_shape",
    "suffixes",
    "wants_rng",
    "weights_problem",
    "with_suffix",
    "write_manifest",
]
