"""The run an estimate is for: device, AMP, optimizer, classes and objects per image, decided once from the keys.

``yolo-ckpt train``, ``profile`` and ``plan`` read the same keys the same way, so the same keys mean the same run.
Each decision is an Ultralytics rule, mirrored or called in :mod:`yolo_ckpt.memory.ultralytics_rules` (the one room
of them, each naming its Ultralytics line); this module puts them together and says, in a sentence each, what the
estimate assumed and why:

- device: ``device=`` as given (``cpu``, ``mps``, or a CUDA device, planned for from any machine); without it, the
  device ``train`` would use: CUDA where torch sees one, else the CPU (``device_type``). The trainers use the
  device Ultralytics selected.
- AMP: Ultralytics' rule (``BaseTrainer._setup_train`` and ``check_amp``): on when ``amp`` is not ``False``/``"fp32"``
  and the device is an accelerator; the CPU and MPS train in fp32 (``amp_enabled``, the one place that decides).
- optimizer: ``optimizer=`` as given; ``auto`` is Ultralytics' ``BaseTrainer.build_optimizer`` rule (AdamW up to 10000
  iterations, MuSGD beyond), with iterations counted as ``_build_train_pipeline`` counts them
  (``train_iterations``); without ``data=`` there are no images to count: AdamW (:func:`optimizer_rule`).
- classes and objects per image: from ``data=`` (Ultralytics' ``check_det_dataset`` and the training dataset the
  trainer builds, :func:`count_data`), the most objects in one image x 4 for mosaic, as ``DetectionTrainer.auto_batch``
  counts them, x 2 more for copy-paste (segment, obb), x 2 for mixup or cutmix and x 3 for both where the run turns
  them on (``augment_factors``); without ``data=``, the model YAML's ``nc`` and ``objects=`` (:func:`objects_rule`).
- the boxes' layout, which bounds the loss's candidate pairs and foreground anchors (:func:`layout_rule`).
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .foreground import ObjectSizes, object_sizes
from .ultralytics_rules import OBJECTLESS_TASKS, augment_factors, optimizer_for, train_iterations, training_dataset


def optimizer_rule(name, images: int | None, batch: int, nbs: int, epochs: int) -> tuple[str, str]:
    """The optimizer whose state a run carries and the rule that picked it.

    Args:
        name: ``optimizer=`` (``auto``, ``SGD``, ``AdamW``, ...).
        images: training images (None when unknown: no ``data=``); batch, nbs, epochs: the run's keys.

    Returns:
        ``(optimizer, rule)``: the optimizer Ultralytics builds, by its name
        (:func:`yolo_ckpt.memory.ultralytics_rules.optimizer_for`: ``"AdamW"``, ``"MuSGD"``, ``"SGD"``, ...;
        :func:`yolo_ckpt.memory.ultralytics_rules.build_optimizer` counts its real state), and a sentence saying which
        optimizer Ultralytics will build and why.
    """
    if str(name).lower() != "auto":
        return optimizer_for(name), f"optimizer={name}"
    if images is None:
        return optimizer_for(
            "auto"
        ), "optimizer=auto: AdamW, as Ultralytics picks for up to 10000 iterations (give data= and epochs= to count them)"
    iterations = train_iterations(images, batch, nbs, epochs)
    picked = optimizer_for("auto", iterations)
    return picked, f"optimizer=auto: {picked} for {iterations} iterations ({images} images, {epochs} epochs; MuSGD above 10000)"


@contextlib.contextmanager
def rng_preserved():
    """Put Python's, NumPy's and torch's (CPU) global random states back on exit. Counting the data builds the
    training dataset, which draws from ``random``; training must then draw the same numbers (the same augmentations)
    as it would without planning, or recompute=auto would not train exactly as stock."""
    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])


@dataclass(frozen=True)
class DataCounts:
    """What a detection-style training set (detect, segment, pose, obb) holds, for the memory model.

    Attributes:
        images: training images (after ``fraction=``).
        max_objects: the most labelled objects in one image.
        augment: the training augmentation's factors on a training image's objects
            (:func:`~yolo_ckpt.memory.ultralytics_rules.augment_factors`).
        sizes: the objects' box sizes under the run's augmentation (:func:`yolo_ckpt.memory.foreground.object_sizes`),
            which bound the assigner's candidate pairs and a segmentation loss's foreground anchors; None for a
            classification set and where the augmentation leaves them unbounded.
        sizes_rule: how the box sizes are bounded, a sentence for the run's assumptions.
    """

    images: int
    max_objects: int
    augment: tuple[tuple[str, int], ...] = (("mosaic", 4),)
    sizes: object = None
    sizes_rule: str = ""

    @property
    def planned_objects(self) -> int:
        """Objects per training image the loss is planned for: ``max_objects`` times every :attr:`augment` factor
        (x 4 for mosaic, as ``DetectionTrainer.auto_batch`` counts them), at least 1."""
        return max(self.max_objects * math.prod(f for _, f in self.augment), 1)


def count_data(args, data: dict, stride: int) -> DataCounts:
    """Build the training dataset as the task's trainer does for AutoBatch
    (:func:`~yolo_ckpt.memory.ultralytics_rules.training_dataset`) and count its images and most objects per image (a
    classification set has no objects); the global random states are left as they were.

    Args:
        args: the run's Ultralytics arguments (an ``IterableSimpleNamespace``: imgsz, task, fraction, classes, ...);
            a list imgsz is counted at its largest side (the dataset takes an int, as training sets it).
        data: the dataset dict of ``check_det_dataset`` (``check_cls_dataset`` for classify); stride: the model's
            largest stride (at least 32).
    """
    with rng_preserved():
        dataset = training_dataset(args, data, stride)
    if args.task == "classify":
        return DataCounts(len(dataset.samples), 0, ())
    augment = augment_factors(args)
    sizes, rule = object_sizes(dataset.labels, args, args.task, math.prod(f for _, f in augment))  # layout_rule
    return DataCounts(len(dataset), max((len(label["cls"]) for label in dataset.labels), default=0), augment, sizes, rule)


@dataclass(frozen=True)
class RunSpec:
    """The run an estimate or plan is for, and where each figure came from.

    Attributes:
        device: ``"cuda"``, ``"cpu"`` or ``"mps"``; amp: whether the step is estimated under autocast.
        optimizer: whose state is counted; optimizer_rule: why (see :func:`optimizer_rule`).
        objects: objects per image the loss is estimated for; objects_rule: where the number came from.
        nc: classes of the model estimated.
        layout: the boxes' layout assumed, which bounds the assigner's candidate pairs (and a segmentation loss's
            foreground anchors): the labels' box sizes, ``object_size=``, or every box the whole image; and how to give
            a better one. Empty for tasks without boxes.
    """

    device: str
    amp: bool
    optimizer: str
    optimizer_rule: str
    objects: int
    objects_rule: str
    nc: int
    layout: str = ""

    def describe(self) -> str:
        """One line for logs and the text output of profile/plan."""
        where = {"cpu": " as Ultralytics trains on the CPU", "mps": " as Ultralytics trains on MPS"}.get(self.device, "")
        precision = "AMP on (2-byte activations)" if self.amp else f"AMP off (fp32){where}"
        objects = f"{self.objects} objects per image" if self.objects else "no objects"
        foreground = f", {self.layout}" if self.layout else ""
        return (
            f"assumed: device {self.device}, {precision}, {self.optimizer_rule}, {objects} ({self.objects_rule}){foreground}, "
            f"{self.nc} classes"
        )

    def to_dict(self) -> dict:
        """The fields as a dict (JSON output, run reports)."""
        return asdict(self)


def objects_rule(counts: DataCounts | None, objects: int, task: str = "detect") -> tuple[int, str]:
    """Objects per image for the loss and where they came from: none for a task whose batch has none
    (:data:`yolo_ckpt.memory.ultralytics_rules.OBJECTLESS_TASKS`), else the data's most times its augmentation's
    factors (x 4 for mosaic: :func:`~yolo_ckpt.memory.ultralytics_rules.augment_factors`) when counted, else
    ``objects``."""
    if task in OBJECTLESS_TASKS:
        return 0, f"a {task} batch has none"
    if counts is None:
        return objects, "objects=" + str(objects)
    factors = "".join(f", x {f} for {name}" for name, f in counts.augment) or " (no mosaic, mixup or cutmix)"
    return counts.planned_objects, f"the data's most in one image, {counts.max_objects}{factors}"


def layout_rule(
    counts: DataCounts | None, task: str = "detect", objects: int = 1, object_size: float | None = None, objects_given: bool = False
) -> tuple[object, str]:
    """The :class:`~yolo_ckpt.memory.foreground.ObjectSizes` the loss is estimated with (they bound the task-aligned
    assigner's candidate pairs and a segmentation loss's foreground anchors) and the sentence saying which layout that
    is and how to give a better one: ``object_size=`` where given (``objects`` boxes per image of that side, a fraction
    of the image's, as trained: it replaces the labels' sizes); else the data's box sizes (``counts``) where the objects
    per image are the data's (not ``objects_given``) and its augmentation leaves them bounded; else every box the whole
    image, the most pairs any layout of ``objects`` objects has. A task without boxes: ``(None, "")``."""
    if task in OBJECTLESS_TASKS:
        return None, ""
    if object_size is not None:
        instead = ", in place of the labels' sizes" if counts is not None else ""
        said = f"box layout: {objects} boxes of {object_size:g} x the image side (object_size={instead})"
        return ObjectSizes.assumed(objects, object_size, task), said
    if counts is not None and counts.sizes is not None and not objects_given:
        return counts.sizes, counts.sizes_rule
    if counts is None:
        how = "give data= to bound it by the labels' box sizes, or object_size= for the largest box side as a fraction of the image"
    elif objects_given:
        how = "objects= replaces the labels and their box sizes: leave it out to bound it by them, or give object_size="
    else:
        how = "give object_size= for the largest box side as a fraction of the image"
    why = f"{counts.sizes_rule}; " if counts is not None and counts.sizes is None and not objects_given else ""
    return ObjectSizes.assumed(objects, 1.0, task), f"box layout: {why}every box the whole image, the worst ({how})"
