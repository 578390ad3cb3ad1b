"""list_mds, list_litdata: the samples of a MosaicML Streaming (MDS) or LitData dataset, as records.

The dataset's own ``index.json`` (read once, local or through fsspec: ``s3://...``) names its
shards and their sample counts, so the listing reads no shard: each sample becomes
``{"mds" | "litdata": root, "shard": i, "pos": j, "index": k}`` (``k`` its place in the
dataset, a stable sample id), and ``count()`` (``len(loader)``) is the index's total. The
samples are read by ``read_samples`` after ``shard`` and ``shuffle_buffer``, so a rank reads
only its own share. With ``shuffle=True`` the listing is permuted every epoch from (seed,
epoch).

They are ``ListFiles`` whose listing comes from an index, so their state and checks are
list_files': a position, the count and a digest of the shard names and counts (a restore
against a dataset that changed is a ``StateError``), exact and elastic resume through
``shard``. An index that cannot be read or names an encoding conveyor does not read is a
``SourceError`` naming it (conveyor/nodes/_sample_formats.py).
"""

from __future__ import annotations

from typing import Any

from conveyor.nodes._sample_formats import SampleSet, open_set
from conveyor.nodes.list_files import ListFiles
from conveyor.storage import Storage


class _ListSamples(ListFiles):
    KIND = ""

    def __init__(self, *, url: str, shuffle: bool = False, seed: int = 0,
                 storage_options: dict[str, Any] | None = None, allow_pickle: bool = False,
                 where: str | None = None):
        if not isinstance(url, str) or not url:
            raise ValueError(f"{url=} must be the dataset's folder (holding index.json)")
        super().__init__(url=url.rstrip("/"), shuffle=shuffle, seed=seed, storage_options=storage_options,
                         where=where)
        self.allow_pickle = allow_pickle

    def sample_set(self) -> SampleSet:
        storage = Storage(storage_options=self.storage_options)
        try:
            return open_set(self.url, self.KIND, storage, allow_pickle=True)  # lists, decodes nothing
        finally:
            storage.close()

    def _list(self) -> tuple[list[str], list[dict]]:
        shards = self.sample_set().shards
        names, records = [], []
        for i, shard in enumerate(shards):
            names.append(f"{shard.url.rsplit('/', 1)[-1]}#{shard.samples}")
            base = len(records)  # the generator below grows records as it goes
            records.extend({self.KIND: self.url, "shard": i, "pos": j, "index": base + j}
                           for j in range(shard.samples))
        self.classes = []
        return names, records


class ListMds(_ListSamples):
    """Yield one record per sample of the MDS dataset at ``url`` (MDSWriter's ``out``).

    Args:
        url: the folder holding ``index.json`` and the ``.mds`` (or ``.mds.zstd``) shards.
        shuffle: permute the listing each epoch, seeded by (seed, epoch).
        seed: the shuffle's seed.
        storage_options: fsspec options (endpoint_url, ...); never logged.
        allow_pickle: accept ``pkl`` columns (unpickling runs code from the file).
        where: text for error notes.

    Example:
        >>> node = ListMds(url="tests/fixtures/formats/mds/plain")
        >>> next(node)
        {'mds': 'tests/fixtures/formats/mds/plain', 'shard': 0, 'pos': 0, 'index': 0}
    """

    OP, UNIT, NAMES, KIND = "list_mds", "sample", "shards", "mds"


class ListLitdata(_ListSamples):
    """Yield one record per sample of the LitData dataset at ``url`` (``optimize()``'s output_dir).

    Args:
        url: the folder holding ``index.json`` and the ``chunk-*.bin`` chunks.
        shuffle: permute the listing each epoch, seeded by (seed, epoch).
        seed: the shuffle's seed.
        storage_options: fsspec options (endpoint_url, ...); never logged.
        allow_pickle: accept ``pickle`` leaves (unpickling runs code from the file).
        where: text for error notes.

    Example:
        >>> node = ListLitdata(url="tests/fixtures/formats/litdata/plain")
        >>> next(node)["litdata"]
        'tests/fixtures/formats/litdata/plain'
    """

    OP, UNIT, NAMES, KIND = "list_litdata", "sample", "chunks", "litdata"
