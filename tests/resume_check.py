"""The resume checker: a state saved at step k, loaded into a fresh loader, must yield exactly
what the uninterrupted run yielded after step k — through the end of the last epoch.

``check_resume(make_loader, epochs)`` runs the graph uninterrupted for ``epochs`` epochs,
taking ``state_dict()`` before the first batch and after every batch, then for each chosen
step builds a fresh loader, loads the state after a JSON round trip, and compares the rest
batch for batch (by a fingerprint of every tensor's bytes, shape and dtype).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Iterable

import torch


def fingerprint(obj: Any) -> Any:
    """A comparable, printable stand-in for a batch."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        digest = hashlib.sha1(t.numpy().tobytes() if t.dtype != torch.bfloat16 else
                              t.view(torch.int16).numpy().tobytes()).hexdigest()[:12]
        return ("tensor", tuple(t.shape), str(t.dtype), digest)
    if isinstance(obj, dict):
        return {k: fingerprint(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [fingerprint(v) for v in obj]
    return obj


def run_with_states(loader: Any, epochs: int) -> tuple[list[tuple[int, Any]], list[dict]]:
    """Every batch (epoch, fingerprint) of ``epochs`` epochs, and the state before each step
    (``states[k]`` is the state after k batches)."""
    batches: list[tuple[int, Any]] = []
    states = [json.loads(json.dumps(loader.state_dict()))]
    for _ in range(epochs):
        for batch in loader:
            batches.append((loader.epoch, fingerprint(batch)))
            states.append(json.loads(json.dumps(loader.state_dict())))
    return batches, states


def remaining(loader: Any, last_epoch: int) -> list[tuple[int, Any]]:
    """After a restore: every batch up to the end of epoch ``last_epoch``."""
    out: list[tuple[int, Any]] = []
    while True:
        for batch in loader:
            if loader.epoch > last_epoch:
                return out
            out.append((loader.epoch, fingerprint(batch)))
        if loader.epoch >= last_epoch:
            return out


def check_resume(make_loader: Callable[[], Any], epochs: int = 2,
                 steps: Iterable[int] | Callable[[int, int], Iterable[int]] | None = None,
                 reuse: bool = False) -> int:
    """Assert that resuming at each step in ``steps`` (default: every step) is exact.

    Each step restores into a new loader; with ``reuse``, one new loader restores every step in
    turn (the first restore into a fresh loader, the next ones into a loader that has run: what
    a trainer that reloads a checkpoint in the same process does), which spares starting worker
    processes again for each step.

    ``steps`` may also be ``steps(n_states, epoch_len)``, chosen once the uninterrupted run has
    shown how many states there are and how many batches the first epoch has.

    Returns:
        the number of batches of the uninterrupted run (so callers can assert it is non-trivial).
    """
    with make_loader() as loader:
        reference, states = run_with_states(loader, epochs)
    last_epoch = reference[-1][0]
    if callable(steps):
        steps = steps(len(states), sum(1 for e, _ in reference if e == reference[0][0]))
    chosen = range(len(states)) if steps is None else [k for k in steps if k < len(states)]
    reused = make_loader() if reuse else None
    try:
        for k in chosen:
            if reused is not None:  # a loader that has run restores again, its workers kept
                reused.load_state_dict(states[k])
                rest = remaining(reused, last_epoch)
            else:
                with make_loader() as fresh:
                    fresh.load_state_dict(states[k])
                    rest = remaining(fresh, last_epoch)
            _compare(k, rest, reference)
    finally:
        if reused is not None:
            reused.close()
    return len(reference)


def _compare(k: int, rest: list, reference: list) -> None:
    expected = reference[k:]
    if rest != expected:
        first_bad = next((i for i, (a, b) in enumerate(zip(rest, expected)) if a != b),
                         min(len(rest), len(expected)))
        raise AssertionError(
            f"resume from step {k} of {len(reference)} differs at batch {k + first_bad}: "
            f"got {len(rest)} batches, expected {len(expected)}; "
            f"got {rest[first_bad] if first_bad < len(rest) else 'nothing'}, "
            f"expected {expected[first_bad] if first_bad < len(expected) else 'nothing'}")
