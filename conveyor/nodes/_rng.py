"""Counter-based seeds: randomness from (seed, epoch, rank, index), never from time or pid.

``derive_seed(*parts)`` mixes any number of integers into one 64-bit seed with SplitMix64,
so a node can make the random stream of window 7 of epoch 3 directly, without replaying the
streams before it, and resume from a state that holds only counters.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """A 64-bit seed that depends on every part and their order.

    Example:
        >>> derive_seed(0, 1) != derive_seed(1, 0)
        True
    """
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK))
    return h


def uniform(*parts: int) -> float:
    """A float in [0, 1) determined by ``parts`` alone."""
    return (derive_seed(*parts) >> 11) * (1.0 / (1 << 53))
