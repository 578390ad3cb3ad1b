"""Functions that the random-chain resume test names as ``chain_fns:<name>`` in its specs."""

from __future__ import annotations


def keep_two_of_three(item) -> bool:
    """Drop every item whose index is a multiple of 3 (items without an index are kept)."""
    index = item.get("index") if isinstance(item, dict) else None
    return not isinstance(index, int) or index % 3 != 0


def tag(item, *, rng) -> dict:
    """A copy of a dict item with one random field from the map's per-sample rng."""
    out = dict(item) if isinstance(item, dict) else {"value": item}
    out[f"r{len(out)}"] = rng.random()
    return out


def fewer_on_odd_ranks(item) -> bool:
    """Keep every item on even ranks, only even indices on odd ranks: ranks end up uneven."""
    import os

    return int(os.environ.get("RANK", 0)) % 2 == 0 or item["index"] % 2 == 0
