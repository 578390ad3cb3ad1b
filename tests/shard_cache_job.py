"""One process of test_shard_cache's shared-cache test: reads the shards named on the command
line through read_tar with a cache folder shared with another process, two epochs, and prints
what it read (a digest of every sample) and its cache counts as JSON."""

from __future__ import annotations

import hashlib
import json
import sys

from torchdata.nodes import IterableWrapper

from conveyor.nodes.read_tar import ReadTar


def main() -> None:
    cache, limit, block, *shards = sys.argv[1:]
    digests, hits = [], 0
    for _ in range(2):
        node = ReadTar(IterableWrapper([{"path": s, "index": i} for i, s in enumerate(shards)]),
                       cache=cache, cache_size=int(limit), block_size=int(block), read_ahead=2)
        h = hashlib.sha256()
        for sample in node:
            h.update(sample["__key__"].encode())
            for k in sorted(k for k, v in sample.items() if isinstance(v, bytes)):
                h.update(k.encode() + sample[k])
        digests.append(h.hexdigest())
        hits += node.stats()["cache_hits"]
        evicted = node.storage.cache.evicted
        node.close()
    print(json.dumps({"digests": digests, "cache_hits": hits, "evicted": evicted}))


if __name__ == "__main__":
    main()
