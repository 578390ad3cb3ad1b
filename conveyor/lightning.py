"""Exact resume under PyTorch Lightning when the loader's length is unknown.

Lightning saves a loader's ``state_dict()`` in every checkpoint. Where ``len(loader)`` is known
it takes each batch as the training step asks for it, and that state is exact. Where the data
decide the length (filter, records read from files, length buckets, ...), its data fetcher
reads one batch ahead to see the epoch's end coming, so the state it saves is one batch past
the last training step, and a resumed fit never trains on that batch. :class:`ExactResume`
puts in the checkpoint the state from before the batches the fetcher holds. Under DDP
Lightning writes the checkpoint of rank 0 only, so it held rank 0's loader state alone and
every other rank failed to resume; :class:`ExactResume` gathers every rank's state into it
(each rank then loads its own)::

    from conveyor.lightning import ExactResume
    trainer = L.Trainer(callbacks=[ExactResume(), ModelCheckpoint(...)])

It needs ``lightning`` (``pip install lightning``); with the older ``pytorch_lightning``
package alone, that one's ``Callback`` is used.
"""

from __future__ import annotations

import logging
from typing import Any

from conveyor.graphs.distributed import every_rank_state, world_size
from conveyor.graphs.loader import Loader

try:
    from lightning.pytorch.callbacks import Callback
except ModuleNotFoundError:  # the pytorch_lightning package, without the unified one
    from pytorch_lightning.callbacks import Callback

log = logging.getLogger(__name__)

__all__ = ["ExactResume"]


class ExactResume(Callback):
    """Saves each conveyor loader's state from before the batches Lightning has read ahead, and
    under DDP every rank's state (Lightning writes rank 0's checkpoint only).

    Lightning's fit loop keeps its training loaders' states in
    ``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]``, one per loader with a
    ``state_dict``, in the order of its combined loader; the fetcher's read-ahead batches are
    ``trainer.fit_loop._data_fetcher.batches`` (Lightning 2.x). Where these are not found (another
    Lightning), it warns once and leaves the checkpoint as it is.

    At the start of the fit and of each epoch it asks each conveyor loader of unknown length
    to keep the states from before its last ``KEEP`` batches (``Loader.keep_behind``): the
    fetcher holds one. (The state from before an epoch's first batch, which the fetcher takes
    before these hooks run, every loader keeps.)
    """

    KEEP = 2  # batches whose states are kept: Lightning's fetcher reads 1 ahead

    def __init__(self) -> None:
        self._warned = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._keep(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._keep(trainer)  # (loaders made again: reload_dataloaders_every_n_epochs)

    def _keep(self, trainer: Any) -> None:
        try:
            loaders = list(trainer.fit_loop._combined_loader.flattened)
        except (AttributeError, TypeError):
            self._warn("this Lightning keeps its loaders elsewhere")
            return
        for dl in loaders:
            if isinstance(dl, Loader) and dl._known_length() is None:
                dl.keep_behind(self.KEEP)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        loop = trainer.fit_loop
        held = len(getattr(getattr(loop, "_data_fetcher", None), "batches", None) or ())
        world = world_size()
        if not held and world <= 1:
            return  # nothing read ahead, and this process's checkpoint is the only one: exact
        try:
            states = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
            loaders = [dl for dl in loop._combined_loader.flattened if callable(getattr(dl, "state_dict", None))
                       and callable(getattr(dl, "load_state_dict", None))]
        except (AttributeError, KeyError, TypeError):
            self._warn("this Lightning keeps its loaders' states elsewhere")
            return
        if len(states) != len(loaders):
            self._warn(f"{len(states)} saved loader states for {len(loaders)} loaders")
            return
        for i, dl in enumerate(loaders):
            if isinstance(dl, Loader):
                if held:
                    try:
                        states[i] = dl.state_dict(behind=held)
                    except ValueError as exc:  # more held than kept (a loader that began another epoch)
                        self._warn(str(exc))
                if world > 1:  # every rank saves (the same loaders), so every rank gathers here
                    states[i] = every_rank_state(states[i])

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("conveyor.lightning.ExactResume: %s; the checkpoint keeps the loader's current "
                        "state, past the batches Lightning read ahead (said once)", why)

