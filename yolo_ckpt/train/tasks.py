"""The Ultralytics task of a trainer class (:func:`task_of`) and yolo-ckpt's defaults for it
(:func:`task_defaults`), both from Ultralytics' own task table."""

from __future__ import annotations

from ..config import TASK_DEFAULTS


def task_defaults(trainer_cls: type) -> dict:
    """:data:`yolo_ckpt.config.TASK_DEFAULTS` of the trainer's task where its nearest Ultralytics trainer is the task's
    own (a user's subclass of it too): RT-DETR's, YOLO-World's and YOLOE's trainers, task detect or segment, train
    heads without a loss region and keep ``cfg/default.yaml``'s."""
    from ultralytics import YOLO

    task = task_of(trainer_cls)
    nearest = next(c for c in trainer_cls.__mro__ if c.__module__.startswith("ultralytics."))
    return TASK_DEFAULTS.get(task, {}) if nearest is YOLO.task_map.fget(None)[task]["trainer"] else {}


def task_of(trainer_cls: type) -> str:
    """The Ultralytics task of a trainer class: the task in Ultralytics' task table whose trainer is its nearest
    ancestor (``SegmentationTrainer`` subclasses ``DetectionTrainer``: its task is ``segment``)."""
    from ultralytics import YOLO

    mro = trainer_cls.__mro__
    ancestors = {t: mro.index(row["trainer"]) for t, row in YOLO.task_map.fget(None).items() if row["trainer"] in mro}
    return min(ancestors, key=ancestors.get)
