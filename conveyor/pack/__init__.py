"""``conveyor pack SRC DST``: write an ImageNet-layout folder as tar shards (WebDataset layout)
or as one LMDB environment, optionally with every image pre-shrunk.

    conveyor pack examples/data/imagenet-sample/train /data/shards/train --shard-size 256MB
    conveyor pack s3://bucket/imagenet/train s3://bucket/imagenet-shards/train
    conveyor pack SRC /data/train.lmdb --format lmdb
    conveyor pack --from mds s3://bucket/mds/train /data/shards/train     (or --from litdata)

With ``--resize N`` each image whose shorter side is above ``N`` is stored re-encoded as JPEG
(``--quality``, default 90) with its shorter side ``N``, aspect kept; smaller images are
stored as they are. Train at 224 from camera-size photos: ``N`` = 256-320 cuts the decode cost
and the bytes many times over (``benchmarks/RESULTS.md``).

This package's face is this module; its parts: ``_samples`` (what is packed, read in order),
``_shrink`` (the resize), ``_tar`` (``pack``: shards and their index), ``_lmdb``
(``pack_lmdb``) and ``_command`` (the command line).
"""

from conveyor.pack._command import add_parser, run
from conveyor.pack._formats import pack_from
from conveyor.pack._lmdb import pack_lmdb
from conveyor.pack._samples import list_samples
from conveyor.pack._shrink import DEFAULT_QUALITY, shrink, target_size
from conveyor.pack._tar import INDEX_FORMAT, INDEX_NAME, pack

__all__ = [
    "DEFAULT_QUALITY",
    "INDEX_FORMAT",
    "INDEX_NAME",
    "add_parser",
    "list_samples",
    "pack",
    "pack_from",
    "pack_lmdb",
    "run",
    "shrink",
    "target_size",
]
