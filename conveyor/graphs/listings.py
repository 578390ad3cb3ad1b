"""The ranks list the same files: a check, under torch.distributed, that never waits.

Every rank lists its files itself (``list_files``, ``list_lmdb``) and ``shard`` deals it the
positions of that listing. A file written while the ranks list, a folder that differs from
node to node, an object store that lists a new object on one node and not yet on another:
then a rank deals positions of another listing than the others, and the ranks read
overlapping shares and miss files without a word; with another count they also yield other
numbers of batches, and DDP's all-reduces go out of step or wait for ever.

``ListingCheck`` puts the count and digest of the rank's listings (from its state: worker
copies' listings too) in torch.distributed's store when the rank takes its first batch, and
compares them with the other ranks' once all are there, looking at its 1st, 2nd, 4th, 8th...
batch: it never waits for another rank (a loader read on one rank only is not held up) and
costs one store request at those batches. A difference is a ``ConveyorError`` on every rank,
naming each rank's listing. The listing is made once per loader, so one comparison does.
Graphs with a listing that no rank shard deals (each rank reading its own folder on purpose)
are not checked.

``listing_sharer`` goes further for remote URLs: rank 0 lists and puts the listing
(compressed JSON) in the store, the other ranks read it from there instead of listing (a
bucket of 1.28 M objects is ~1,300 LIST requests a rank). A rank waits for rank 0's listing
at most ``timeout`` seconds, then fails naming rank 0 and the URL; a listing that fails on
rank 0 fails on every rank at once, with rank 0's message.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import threading
import zlib
from collections import Counter
from typing import Any, Callable

from conveyor.errors import ConveyorError, SourceError
from conveyor.nodes import ListFiles
from conveyor.storage import is_local

log = logging.getLogger(__name__)

_serials: Counter[str] = Counter()  # loaders of each spec digest made in this process


def _store() -> Any:
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        return dist.distributed_c10d._get_default_store()
    except (ImportError, AttributeError, RuntimeError, ValueError):
        return None


_shared_serials: Counter[tuple[str, int]] = Counter()  # listings of each URL shared, by rank
_shared_lock = threading.Lock()
_FAILED = b"E"  # rank 0's listing failed: the message follows
_LISTING = b"L"  # the listing, zlib-compressed JSON, follows


def shares(choice: str, url: str) -> bool:
    """Whether ``list_files(share: choice)`` of ``url`` lists on rank 0 only: ``rank0``; ``each``
    never; ``auto`` for remote URLs only (a local path may be another disk, or another copy of
    the data, on each node: each rank lists its own, and ``ListingCheck`` compares them)."""
    return choice == "rank0" or (choice == "auto" and not is_local(url))


def listing_sharer(url: str, *, rank: int, world: int, timeout: float,
                   store: Callable[[], Any] | None = None) -> Callable[[Callable[[], dict]], dict]:
    """``ListFiles``'s ``share`` hook: rank 0 calls ``make`` and puts the listing in the store,
    the others take it from there. ``store`` gives the store (default: the process group's);
    without one (no torch.distributed, or a worker process forked from the rank) each lists.

    Raises (from the hook):
        SourceError: rank 0's listing failed (its message), or did not come in ``timeout`` s.
    """
    made_in = os.getpid()
    get_store = store or _store

    def share(make: Callable[[], dict]) -> dict:
        st = get_store() if os.getpid() == made_in else None
        if st is None or world <= 1:
            return make()
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        with _shared_lock:  # the n-th listing of this URL in this process meets the n-th on the others
            _shared_serials[url, rank] += 1
            serial = _shared_serials[url, rank]
        name = hashlib.sha256(url.encode()).hexdigest()[:16]
        key = f"conveyor/shared-listing/{attempt}/{name}/{serial}"
        if rank == 0:
            try:
                listing = make()
            except ConveyorError as exc:
                st.set(key, _FAILED + str(exc).encode())
                raise
            st.set(key, _LISTING + zlib.compress(json.dumps(listing, separators=(",", ":")).encode(), 1))
            return listing
        try:
            st.wait([key], datetime.timedelta(seconds=timeout))
            raw = bytes(st.get(key))
        except (RuntimeError, OSError) as exc:  # DistStoreError: timed out, or the store is gone
            raise SourceError(f"list_files {url!r}: rank {rank} waited {timeout:g}s for rank 0's listing "
                              f"(list_files share: rank0) and it did not come ({exc}); is rank 0 alive "
                              "and listing? raise share_timeout for a listing that takes longer, or set "
                              "share: each to list on every rank") from exc
        if raw[:1] == _FAILED:
            raise SourceError(f"list_files {url!r}: rank 0 could not list it: {raw[1:].decode(errors='replace')}")
        log.debug("list_files %s: the listing of rank 0 (%d bytes compressed)", url, len(raw))
        return json.loads(zlib.decompress(raw[1:]))

    return share


def _where(params: Any) -> str:
    return str(getattr(params, "url", None) or getattr(params, "path", "?"))


def listings_to_check(plan: Any) -> list[str]:
    """The listing nodes of ``plan`` (``OpSpec.listing``) when every one of them feeds a rank
    shard, else []."""
    from conveyor.graphs.even import is_rank_shard, reachable

    reach = reachable(plan)
    listings = [n for n in plan.nodes if n in reach and plan.nodes[n].op.listing]
    above_shards: set[str] = set()
    todo = [n for n in reach if is_rank_shard(plan.nodes[n])]
    while todo:
        for i in plan.nodes[todo.pop()].inputs:
            if i not in above_shards:
                above_shards.add(i)
                todo.append(i)
    if not listings or any(n not in above_shards for n in listings):
        return []
    return listings


class ListingCheck:
    """Compares this rank's listings with every other rank's, through the process group's store.

    Args:
        plan: the checked spec (names the listing nodes in the error).
        names: the listing nodes (``listings_to_check``).
        digest: the spec's digest: the key the ranks share (with the how-many-th loader of that
            spec this is in the process, so each loader meets its counterparts).
        rank, world: this process's place.
    """

    def __init__(self, plan: Any, names: list[str], digest: str, serial: int, rank: int, world: int):
        self.plan = plan
        self.names = names
        self.rank = rank
        self.world = world
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restarted job's own keys
        self.prefix = f"conveyor/listing/{attempt}/{digest}/{serial}/"
        self.batches = 0
        self.mine: list[list[Any]] | None = None
        self.done = False

    @staticmethod
    def serial(digest: str) -> int:
        """The next loader's number among this process's loaders of the spec ``digest``."""
        _serials[digest] += 1
        return _serials[digest]

    def after_batch(self, graph_state: Callable[[], dict]) -> None:
        """Called after each batch the rank takes; looks at batches 1, 2, 4, 8...

        Raises:
            ConveyorError: another rank lists other files.
        """
        self.batches += 1
        if self.done or self.batches & (self.batches - 1):
            return
        store = _store()
        if store is None:
            self.done = True
            return
        try:
            seen = self._compare(store, graph_state)
        except (RuntimeError, OSError) as exc:  # the store is gone: the job is ending anyway
            log.debug("the ranks' listings are not compared: %s", exc)
            self.done = True
            return
        if seen is None or all(v == self.mine for v in seen.values()):
            return
        nodes = ", ".join(f"'{n}' ({self.plan.nodes[n].op.name} {_where(self.plan.nodes[n].params)!r})"
                          for n in self.names)

        def said(listing: list[list[Any]]) -> str:
            return " and ".join(f"{c} listed (digest {d})" for c, d in listing)

        raise ConveyorError(
            f"{self.plan.path}: the ranks list different data at {nodes}: "
            + "; ".join(f"rank {r}: {said(v)}" for r, v in seen.items())
            + f" (this is rank {self.rank}). A file added or removed while the ranks listed, or a folder "
            "that differs between nodes: shard deals positions of the listing, so the ranks would read "
            "overlapping shares, miss files and (with other counts) yield other numbers of batches. "
            "Give every rank the same files")

    def _compare(self, store: Any, graph_state: Callable[[], dict]) -> dict[int, Any] | None:
        """Every rank's listings once all ranks have put theirs (this one's first), else None."""
        if self.mine is None:
            mine = sorted({(c, d) for c, d in ListFiles.listings_in(graph_state())})
            if not mine:
                return None  # worker copies have not reported a state yet
            self.mine = [list(x) for x in mine]
            store.set(self.prefix + f"rank{self.rank}", json.dumps(self.mine))
        keys = [self.prefix + f"rank{r}" for r in range(self.world)]
        if not store.check(keys):
            return None
        self.done = True
        return {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
