"""Datasets, iterables and transforms that the bring-your-own-code tests name in specs."""

from __future__ import annotations

import random

import torch


class Squares(torch.utils.data.Dataset):
    """A map-style dataset: item i is {"x": i * i, "label": i % classes}; ``bad`` indexes raise."""

    def __init__(self, n: int, classes: int = 2, bad: list[int] | None = None):
        self.n = n
        self.classes = classes
        self.bad = set(bad or [])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if i in self.bad:
            raise ValueError(f"item {i} is broken")
        return {"x": i * i, "label": i % self.classes, "i": i}


def imbalanced(n_major: int = 100, n_minor: int = 10) -> list:
    """A 10:1 imbalanced dataset: (i, label) with n_major of class 0, n_minor of class 1."""
    return [(i, 0) for i in range(n_major)] + [(n_major + i, 1) for i in range(n_minor)]


def balance(dataset) -> list[float]:
    """One weight per item, inverse to its class's frequency."""
    counts: dict[int, int] = {}
    for _, label in dataset:
        counts[label] = counts.get(label, 0) + 1
    return [1.0 / counts[label] for _, label in dataset]


def hf_dataset(n: int):
    """A Hugging Face datasets.Dataset built in memory (no hub)."""
    from datasets import Dataset

    return Dataset.from_dict({"x": list(range(n)), "label": [i % 3 for i in range(n)]})


NOT_A_DATASET = 42


class ThreadLog(Squares):
    """Squares that records which thread read each item."""

    threads: list[str] = []

    def __getitem__(self, i: int) -> dict:
        import threading

        ThreadLog.threads.append(threading.current_thread().name)
        return super().__getitem__(i)


class Jitter:
    """A configured transform: made once per worker with ``scale``, called per item; draws from
    the per-sample ``generator`` (torch) and ``rng`` (random) the map gives it."""

    made: list[int] = []

    def __init__(self, scale: float, offset: float = 0.0):
        import threading

        self.scale = scale
        self.offset = offset
        self.calls = 0
        Jitter.made.append(threading.get_ident())

    def __call__(self, item, *, generator: torch.Generator, rng: random.Random, bias: float = 0.0):
        self.calls += 1
        noise = torch.rand(3, generator=generator) * self.scale
        return {"index": item["index"], "noise": noise + self.offset + bias, "coin": rng.random() < 0.5}


class NotCallable:
    def __init__(self, k: int = 1):
        self.k = k


def scale(item, *, k: int):
    return item * k


class Counting(torch.utils.data.IterableDataset):
    """A torch IterableDataset without state: 0..n-1 as {"v": i}."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter({"v": i} for i in range(self.n))


def generate(n: int):
    """A generator function: a one-shot iterator each call."""
    for i in range(n):
        yield {"v": i * 2}


def hf_stream(n: int):
    """A Hugging Face IterableDataset (state_dict/load_state_dict). Not shuffled: Hugging Face's
    shuffle buffer is not in its state, so a shuffled stream does not resume exactly."""
    from datasets import Dataset

    return Dataset.from_dict({"v": list(range(n))}).to_iterable_dataset(num_shards=2)


class KeepAbove:
    """A configured predicate: keeps records whose index is above ``limit``."""

    def __init__(self, limit: int):
        self.limit = limit

    def __call__(self, item) -> bool:
        return item["index"] > self.limit


class RankStream(torch.utils.data.IterableDataset):
    """A torch IterableDataset that shards itself by rank, as many do (and Hugging Face's
    split_dataset_by_node): {"v": i} for i in 0..n-1 with i % WORLD_SIZE == RANK."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        import os

        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        return iter({"v": i} for i in range(self.n) if i % world == rank)


class StreamingLike(torch.utils.data.IterableDataset):
    """A stand-in for mosaicml-streaming's ``StreamingDataset`` (which cannot be installed here),
    with its resume protocol as its docs and code give it: ``state_dict(num_samples,
    from_beginning)`` (both required) and ``load_state_dict(obj)``; each ``iter()`` is its next
    epoch (counted when the pass starts, the generator's first item), an epoch's order
    depends on the epoch, and a loaded state is picked up by the next pass."""

    calls: list = []  # (num_samples, from_beginning) of every state_dict call

    def __init__(self, n: int):
        self.n = n
        self.next_epoch = 0
        self._resume_state: dict | None = None

    def __len__(self) -> int:
        return self.n

    def _resume(self, epoch: int) -> tuple[int, int]:
        if self._resume_state is None or self._resume_state["epoch"] < epoch:
            return epoch, 0
        return self._resume_state["epoch"], self._resume_state["sample_in_epoch"]

    def __iter__(self):
        epoch, start = self._resume(self.next_epoch)
        self.next_epoch = epoch + 1
        for i in range(start, self.n):
            yield {"v": (i * 3 + epoch) % self.n, "epoch": epoch}

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        StreamingLike.calls.append((num_samples, from_beginning))
        epoch, offset = self._resume(self.next_epoch - 1)
        return {"epoch": epoch, "sample_in_epoch": num_samples if from_beginning else offset + num_samples,
                "num_canonical_nodes": 1, "shuffle_seed": 9176}

    def load_state_dict(self, obj: dict) -> None:
        self._resume_state = dict(obj)


class NeedsStep(Counting):
    """An iterable whose state_dict takes a required argument conveyor has nothing for."""

    def state_dict(self, step: int) -> dict:
        raise AssertionError("never called: conveyor reads the signature first")

    def load_state_dict(self, state: dict) -> None:
        raise AssertionError("never called")


class Unlabelled(Squares):
    """Squares whose items at ``unlabelled`` indexes have ``label: None`` (a Hugging Face row
    with a missing value reads so)."""

    def __init__(self, n: int, unlabelled: list[int]):
        super().__init__(n)
        self.unlabelled = set(unlabelled)

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        return {**item, "label": None} if i in self.unlabelled else item
