"""The hybrid schedule (issue 46, item 3): a train cell with ``hybrid: true`` trains on tiles for all but its last
``close_mosaic`` epochs, then on the full images at the cell's imgsz, in one run under one memory budget: one
optimizer, learning-rate schedule, EMA and epoch counter, validated on the full images at the cell's imgsz throughout.

Done the way Ultralytics closes mosaic (``BaseTrainer._do_train``, engine/trainer.py 8.4.190: at ``epoch >= epochs -
close_mosaic`` it changes its train loader's dataset): :class:`TileSchedule`'s callbacks swap the trainer's train
loader and its recomputation, nothing else. The run itself is the full-resolution run, its ``data`` the full images
and its ``imgsz`` the cell's, so its validation, its recompute plan (``recompute=auto`` planned at that imgsz by the
trainer's ``setup_model``, which patches the model before EMA and AutoBatch copy it) and its last phase are arm (b)'s.
The tiles train without recomputation (the plan is taken off for them and put back at the switch,
``apply_recompute``: a class swap on the same modules; parameters, optimizer state and BatchNorm buffers untouched):
recomputation changes no value, so the weights are those of either choice, and the tiles arm's size fits the budget
without it (:func:`check_phases` plans each phase under its own recomputation), so it would only add recomputed
forwards to the tile phase's time. The EMA copy keeps the set-up's patched classes, inert in its no-grad evaluation
and pickled as stock.

The switch is fixed before the run, ``epochs - close_mosaic`` (:func:`switch_epoch`), and re-derived from the epoch
at every epoch's start, so a resumed run (Ultralytics restores the epoch) trains in the phase of its epoch. Two
consequences of ``_do_train`` counting batches with the length ``nb`` of the loader it started with: the tile loader
is installed before that count in every leg of the run (fresh or resumed, in either phase), so every leg counts the
tiles' ``nb``, as an uninterrupted run does; and in each full-resolution epoch the batch count ``ni = i + nb *
epoch`` jumps at the epoch's start (fewer full images than tiles), so that epoch's first optimizer step comes after
the previous epoch's leftover batches and this one (fewer than ``nbs`` images, once an epoch); the warmup, counted
in the same batches, is over before the switch unless ``warmup_epochs`` reaches it. A resumed run resumes exactly
(:mod:`yolo_ckpt.train.exact_resume`) in either phase: one resumed in the tile phase has its ``resume_state.pt``, of
the tile loader, checked against the loader the trainer built, of the full images, before these callbacks run (and
said in one line to resume as Ultralytics does); ``on_pretrain_routine_end`` takes the resume again (the trainer's
``resume_training``) once the tile loader is in place.
"""

from __future__ import annotations

from pathlib import Path

from ultralytics.utils import DEFAULT_CFG_DICT, LOCAL_RANK, LOGGER

from yolo_ckpt.errors import ConfigError
from yolo_ckpt.memory import MemoryModel, size_text


def switch_epoch(epochs: int, close_mosaic: int) -> int:
    """The first full-resolution epoch (0-based, as ``trainer.epoch``): ``epochs - close_mosaic``, the epoch
    Ultralytics closes mosaic at.

    Raises:
        ConfigError: unless ``0 < close_mosaic < epochs`` (the schedule would have no tile or no full epoch)."""
    if isinstance(close_mosaic, bool) or not isinstance(close_mosaic, int) or not 0 < close_mosaic < epochs:
        raise ConfigError(
            f"hybrid: close_mosaic={close_mosaic!r} epochs at full resolution of epochs={epochs}; valid: an int in [1, {epochs - 1}] "
            "(the tiles train the epochs before)"
        )
    return epochs - close_mosaic


def check_settings(settings: dict) -> int:
    """Check a matrix's settings for a hybrid cell (``epochs``, ``close_mosaic``, Ultralytics' defaults where unset; no
    ``time=``, which changes the epochs while the run trains) and return the switch epoch (:func:`switch_epoch`).

    Raises:
        ConfigError: naming the bad setting and the valid values."""
    if settings.get("time"):
        raise ConfigError(f"hybrid: time={settings['time']} changes the epochs while the run trains; the switch is fixed: use epochs=")
    if settings.get("multi_scale"):
        raise ConfigError(f"hybrid: multi_scale={settings['multi_scale']} scales every batch to the run's imgsz, the tiles' too; valid: 0")
    epochs = settings.get("epochs", DEFAULT_CFG_DICT["epochs"])
    return switch_epoch(int(epochs), settings.get("close_mosaic", DEFAULT_CFG_DICT["close_mosaic"]))


def check_phases(memory: MemoryModel, batch: int, phases: dict, budget: int) -> None:
    """Refuse a hybrid cell one of whose phases does not fit its budget, before anything is written: each phase's
    estimated peak (:meth:`~yolo_ckpt.memory.MemoryModel.peak` of its recomputation's units at ``batch``, with the
    headroom: :meth:`~yolo_ckpt.memory.MemoryModel.fits`) against ``budget``.

    Args:
        memory: the cell's memory model (its data, model, optimizer, device). phases: ``{name: (imgsz, recompute)}``
            (the tiles' without recomputation, the full images' with the plan: a ``recompute=`` value, auto already
            planned). budget: bytes.

    Raises:
        ConfigError: one line naming the phase, its imgsz, its estimated peak and the budget."""
    for name, (imgsz, recompute) in phases.items():
        peak = memory.peak(memory.units(recompute), batch, imgsz)
        if not memory.fits(peak, budget):
            raise ConfigError(
                f"hybrid: the {name} phase (imgsz={imgsz}, batch={batch}, recompute={recompute}) needs {size_text(peak)}, over "
                f"memory_budget={size_text(budget)} with its headroom; give smaller tiles or a larger budget"
            )


class TileSchedule:
    """The callbacks of a hybrid run (see the module docstring): ``on_pretrain_routine_end`` builds the tile loader and
    puts it in place of the trainer's (its ``data``'s, at its ``imgsz``), kept aside, and before the switch takes the
    recomputation off (and takes a resume again, now of the tile loader); ``on_train_epoch_start`` puts that loader
    and the run's plan (``trainer.policy``) back from the switch epoch on (before ``_do_train`` closes its mosaic at
    the same epoch).

    Args:
        tiles: the tile dataset's ``data.yaml`` (:func:`yolo_ckpt.data.tiles.tile_dataset`); its ``train`` split trains.
        imgsz: the tiles' side (px), the imgsz they train at.
    """

    def __init__(self, tiles, imgsz: int):
        from ultralytics.utils import YAML

        spec = YAML.load(tiles)
        self.train = str(Path(spec["path"]) / spec["train"])
        self.imgsz = imgsz
        self.full = None  # the trainer's own (full-image) loader while the tiles train

    def add_to(self, model) -> None:
        """Add the callbacks to an Ultralytics ``YOLO`` model (its trainer takes them, a resumed one included)."""
        model.add_callback("on_pretrain_routine_end", self.on_pretrain_routine_end)
        model.add_callback("on_train_epoch_start", self.on_train_epoch_start)

    def on_pretrain_routine_end(self, trainer) -> None:
        """Put the tile loader in place: built as the trainer builds its own (``get_dataloader``, the run's batch,
        augmentation and workers) at the tiles' imgsz. Before the switch, take the recomputation off and, in a resumed
        run, take the resume again (``last.pt``, the trainer's ``resume_training``: exact with the tile loader)."""
        imgsz, trainer.args.imgsz = trainer.args.imgsz, self.imgsz  # build_yolo_dataset reads the size from the args
        try:
            batch = trainer.batch_size // max(trainer.world_size, 1)  # as _build_train_pipeline splits it
            tiles = trainer.get_dataloader(self.train, batch_size=batch, rank=LOCAL_RANK, mode="train")
        finally:
            trainer.args.imgsz = imgsz
        self.full, trainer.train_loader = trainer.train_loader, tiles
        if trainer.start_epoch < switch_epoch(trainer.epochs, trainer.args.close_mosaic):
            trainer.apply_recompute("none")
            if trainer.resume:  # the exact resume state is of the tile loader, now in place: its resume taken again
                from ultralytics.nn.tasks import load_checkpoint

                LOGGER.info("hybrid: resumed in the tile phase: the resume taken again, the tile loader in place (not the line above's)")
                trainer.resume_training(load_checkpoint(trainer.args.model)[1])

    def on_train_epoch_start(self, trainer) -> None:
        """From the switch epoch on, the trainer's own loader and recompute plan again."""
        switch = switch_epoch(trainer.epochs, trainer.args.close_mosaic)
        if trainer.epoch >= switch and self.full is not None:
            full = f"the full images at {trainer.args.imgsz}, recompute={trainer.policy.spec}"
            LOGGER.info(f"hybrid: epochs {switch + 1}-{trainer.epochs}: {full} (tiles of {self.imgsz} px before)")
            if hasattr(trainer.train_loader, "close"):
                trainer.train_loader.close()
            trainer.train_loader, self.full = self.full, None
            trainer.apply_recompute(trainer.policy.spec)
