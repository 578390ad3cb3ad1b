"""Exact resume under the Hugging Face ``Trainer`` and ``accelerate``, on every rank.

**Trainer.** It saves no loader state of its own: on ``train(resume_from_checkpoint=...)`` it
fast-forwards the loader by asking accelerate's ``skip_first_batches`` for a new ``DataLoader``
over ``loader.dataset`` (a conveyor ``Loader`` has none: ``AttributeError``), and under DDP it
writes from one process. :class:`ExactResume` writes every rank's loader state into each
checkpoint folder (``conveyor_loader.json``, gathered to the process that writes the checkpoint)
and loads it when training resumes; the Trainer's skip of a conveyor loader then returns the
restored loader itself, after checking that it stands where the Trainer means to skip to.
:class:`LoaderTrainer` (or :class:`LoaderTrainerMixin` for a Trainer class of your own) trains
on a loader and adds the callback::

    from conveyor.hf import LoaderTrainer
    trainer = LoaderTrainer(model=model, args=TrainingArguments(...), train_loader=loader)
    trainer.train(resume_from_checkpoint=True)      # mid-epoch, exactly, every rank

**accelerate.** ``save_state`` writes the registered objects from the main process only, so a
loader registered as it is kept rank 0's state alone. Register ``EveryRank(loader)``: its
``state_dict()`` gathers every rank's state (call ``save_state`` on every process, as accelerate
asks), and each rank's ``load_state`` takes its own::

    accelerator.register_for_checkpointing(EveryRank(loader))

It needs ``transformers`` for the Trainer parts (``pip install conveyor[hf]``); ``EveryRank``
needs only torch.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from typing import Any

from conveyor.errors import StateError
from conveyor.graphs.distributed import every_rank_state
from conveyor.graphs.loader import Loader
from conveyor.graphs.state import rank_states

try:
    from transformers import Trainer, TrainerCallback
except ModuleNotFoundError as exc:  # accelerate alone: EveryRank still works
    Trainer = TrainerCallback = None  # type: ignore[assignment,misc]
    _MISSING = exc

log = logging.getLogger(__name__)

__all__ = ["STATE_FILE", "EveryRank", "ExactResume", "LoaderTrainer", "LoaderTrainerMixin"]

STATE_FILE = "conveyor_loader.json"  # in each checkpoint-N folder the Trainer writes

# loaders ExactResume restored, with the batches of their epoch the restored state had taken
_RESTORED: "weakref.WeakKeyDictionary[Loader, int]" = weakref.WeakKeyDictionary()


class EveryRank:
    """A loader whose ``state_dict()`` holds every rank's state, for
    ``accelerator.register_for_checkpointing`` (which saves the main process's object only).

    ``state_dict()`` is a collective under torch.distributed: call ``save_state`` on every rank.
    ``load_state_dict`` gives the loader the merged state; each rank takes its own entry (or, on
    another world size, resumes elastically).

    Args:
        loader: the conveyor loader.

    Example:
        >>> accelerator.register_for_checkpointing(EveryRank(loader))   # doctest: +SKIP
        >>> accelerator.save_state(folder)                              # on every rank
    """

    def __init__(self, loader: Loader):
        if not isinstance(loader, Loader):
            raise TypeError(f"EveryRank: expected a conveyor Loader, got {type(loader).__name__}")
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return every_rank_state(self.loader.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


def _loader_of(found: Any, given: Loader | None) -> Loader | None:
    if given is not None:
        return given
    return found if isinstance(found, Loader) else None


def _restored_skip(loader: Loader, num_batches: int) -> Loader:
    """The Trainer's skip of ``num_batches`` batches of a conveyor loader: the loader itself,
    where ExactResume restored it to just that place."""
    taken = _RESTORED.get(loader)
    if taken is None:
        raise StateError(
            f"{loader.spec_path}: the Trainer resumes {num_batches} batch(es) into an epoch, but this "
            "conveyor loader was not restored: add conveyor.hf.ExactResume() to the Trainer's callbacks "
            f"(it saves the loader's state as {STATE_FILE} in each checkpoint), or set "
            "ignore_data_skip=True to start that epoch from its first batch")
    if taken != num_batches:
        raise StateError(
            f"{loader.spec_path}: the Trainer resumes {num_batches} batch(es) into epoch {loader.epoch}, "
            f"but the loader's saved state resumes after {taken}: the checkpoint's loader state and "
            "trainer state disagree (another world size, batch size or gradient accumulation? The "
            "Trainer counts an epoch's steps from len(loader), which must be known past the first epoch)")
    return loader


def _install_skip() -> None:
    """Route ``transformers.trainer``'s ``skip_first_batches`` through :func:`_restored_skip` for
    conveyor loaders (every other loader goes to accelerate's, as before). The Trainer looks the
    name up in its module when it resumes, and has no other hook for it."""
    import transformers.trainer as trainer_module

    original = getattr(trainer_module, "skip_first_batches", None)
    if original is None or getattr(original, "_conveyor", False):
        return

    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if isinstance(dataloader, Loader):
            return _restored_skip(dataloader, num_batches)
        return original(dataloader, num_batches)

    skip_first_batches._conveyor = True  # type: ignore[attr-defined]
    skip_first_batches.__wrapped__ = original  # type: ignore[attr-defined]
    trainer_module.skip_first_batches = skip_first_batches


if TrainerCallback is not None:
    _install_skip()  # so that a Trainer of the user's own, without ExactResume, gets the clear error

    class ExactResume(TrainerCallback):
        """Keeps every rank's loader state in each Trainer checkpoint and restores it on
        ``train(resume_from_checkpoint=...)``.

        The loader is the one ``get_train_dataloader()`` returned (the Trainer hands it to every
        callback), or ``loader`` where given. The Trainer takes exactly the batches it trains on
        (gradient accumulation's too), so the state at ``on_save`` is exact. Under DDP every
        rank's state is gathered (one small collective per checkpoint) and written by the
        processes that write the checkpoint (``args.should_save``): one file holds every rank, as
        the rest of the checkpoint does, with no shared filesystem needed beyond the Trainer's own,
        and a resume on another world size can read it. With ``ignore_data_skip=True`` the
        Trainer starts the resumed epoch over, and so does the loader (no state is loaded).

        Args:
            loader: the conveyor loader, where the Trainer's own is not it.
        """

        def __init__(self, loader: Loader | None = None):
            self.loader = loader
            self.resume_from: str | None = None  # the checkpoint folder, where LoaderTrainer knows it

        def on_save(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
            loader = _loader_of(train_dataloader, self.loader)
            if loader is None:
                return
            saved = every_rank_state(loader.state_dict())  # every rank calls on_save
            if not args.should_save:
                return
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, STATE_FILE)
            with open(f"{path}.tmp", "w") as f:
                json.dump(saved, f)
            os.replace(f"{path}.tmp", path)

        def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
                           **kwargs: Any) -> None:
            loader = _loader_of(train_dataloader, self.loader)
            folder, self.resume_from = self.resume_from, None
            if loader is None or state.global_step == 0:
                return  # a fresh run (the Trainer loaded no checkpoint's trainer state)
            if args.ignore_data_skip:
                log.info("conveyor.hf.ExactResume: ignore_data_skip=True: the loader starts the resumed "
                         "epoch from its first batch, as the Trainer does")
                return
            folder = folder or os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            path = os.path.join(folder, STATE_FILE)
            if not os.path.isfile(path):
                raise StateError(f"{path}: the Trainer resumes from step {state.global_step}, but the checkpoint "
                                 "holds no conveyor loader state (saved without conveyor.hf.ExactResume?); set "
                                 "ignore_data_skip=True to start its epoch from the first batch")
            with open(path) as f:
                saved = json.load(f)
            loader.load_state_dict(saved)
            own = next(iter(rank_states(loader.state_dict()).values()))
            _RESTORED[loader] = own["yielded"]

    class LoaderTrainerMixin:
        """A ``Trainer`` that trains on a conveyor loader (``train_loader=``) and resumes it
        exactly: ``get_train_dataloader()`` returns the loader, :class:`ExactResume` is added to
        the callbacks where it is missing, and ``train(resume_from_checkpoint=...)`` tells it the
        checkpoint folder. Put it before the Trainer class: ``class T(LoaderTrainerMixin, Trainer)``.

        The loader shards itself by rank, so the Trainer does not wrap it (no ``accelerator.prepare``);
        batches are moved to the device by the Trainer as any batch is.
        """

        def __init__(self, *args: Any, train_loader: Loader, **kwargs: Any):
            if not isinstance(train_loader, Loader):
                raise TypeError(f"train_loader: expected a conveyor Loader, got {type(train_loader).__name__}")
            super().__init__(*args, **kwargs)
            self.train_loader = train_loader
            if not any(isinstance(cb, ExactResume) for cb in self.callback_handler.callbacks):
                self.add_callback(ExactResume())

        def get_train_dataloader(self) -> Loader:
            return self.train_loader

        def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
            if resume_from_checkpoint is True:
                from transformers.trainer_utils import get_last_checkpoint

                resume_from_checkpoint = get_last_checkpoint(self.args.output_dir) or True  # None: the Trainer's error
            for cb in self.callback_handler.callbacks:
                if isinstance(cb, ExactResume):
                    cb.resume_from = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
            return super().train(resume_from_checkpoint, *args, **kwargs)

    class LoaderTrainer(LoaderTrainerMixin, Trainer):
        """``transformers.Trainer`` on a conveyor loader, resumed exactly: see :class:`LoaderTrainerMixin`."""


def __getattr__(name: str) -> Any:
    if name in __all__ and TrainerCallback is None:
        raise ModuleNotFoundError(f"conveyor.hf.{name} needs transformers (pip install conveyor[hf]): "
                                  f"{_MISSING}") from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
