"""The run an estimate is for: device, AMP, optimizer, classes and objects per image, decided once from the keys.

``yolo-ckpt train``, ``profile`` and ``plan`` read the same keys the same way, so the same keys mean the same run:

- device: ``device=`` as given (``cpu``, ``mps``, or a CUDA device, planned for from any machine); without it, the
  device ``train`` would use: CUDA where torch sees one, else the CPU (:func:`device_type`). The trainers use the
  device Ultralytics selected.
- AMP: Ultralytics' rule (``BaseTrainer._setup_train`` and ``check_amp``): on when ``amp`` is not ``False``/``"fp32"``
  and the device is an accelerator; the CPU and MPS train in fp32. :func:`amp_enabled` is the one place that decides.
- optimizer: ``optimizer=`` as given; ``auto`` is Ultralytics' ``BaseTrainer.build_optimizer`` rule (AdamW up to 10000
  iterations, MuSGD beyond), with iterations counted as ``_build_train_pipeline`` counts them
  (``ceil(images / max(batch, nbs)) * epochs``); without ``data=`` there are no images to count: AdamW.
- classes and objects per image: from ``data=`` (Ultralytics' ``check_det_dataset`` and the training dataset the
  trainer builds), the most objects in one image x 4 for mosaic, as ``DetectionTrainer.auto_batch`` counts them,
  x 2 more for copy-paste (segment, obb), x 2 for mixup or cutmix and x 3 for both where the run turns them on
  (:func:`augment_factors`);
  without ``data=``, the model YAML's ``nc`` and ``objects=``.

The trainers read three more Ultralytics rules here: which layers ``freeze=`` freezes (:func:`frozen_layers`), the
memory fraction AutoBatch fills (:func:`autobatch_fraction`) and the imgsz it sizes for (:func:`autobatch_imgsz`). Each
rule that Ultralytics computes inline, and so cannot be called, is mirrored once, here, naming the Ultralytics
function it mirrors; tests/test_runspec.py checks each against Ultralytics itself.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch
from ultralytics.utils.checks import check_imgsz

from .foreground import ObjectSizes, object_sizes
from .measure import OBJECTLESS_TASKS, optimizer_for


def device_type(device) -> str:
    """The device type a ``device=`` value trains on, without selecting it (Ultralytics' ``select_device``):
    ``"cpu"``, ``"mps"``, or ``"cuda"`` for a CUDA index or list (``0``, ``cuda:0``, ``0,1``, ``-1``: a plan for a GPU
    from any machine); no value is the device ``train`` would use, CUDA where torch sees one, else the CPU."""
    value = str(device if device is not None else "").strip().lower()
    if value in {"cpu", "mps", "mps:0"}:
        return value[:3]
    return "cuda" if value or torch.cuda.is_available() else "cpu"


def trainable_as_trained(model, freeze) -> None:
    """Set ``requires_grad`` on ``model``'s parameters as ``BaseTrainer._setup_train`` does before training (mirrored:
    it sets them inline): off for ``freeze=``'s layers and the DFL, on for every other floating-point parameter (a
    trained ``best.pt`` is stored with them off)."""
    frozen = freeze if isinstance(freeze, list) else range(freeze) if isinstance(freeze, int) else []
    names = [f"model.{x}." for x in frozen] + [".dfl"]
    for name, p in model.named_parameters():
        p.requires_grad = not any(n in name for n in names) and p.dtype.is_floating_point


def frozen_layers(freeze) -> list[int]:
    """Layer indices whose parameters Ultralytics' ``freeze=`` freezes, as ``BaseTrainer._setup_train`` reads it
    (mirrored: it freezes inline, by the parameter-name prefixes ``model.{x}.``): an int ``n`` -> ``0..n-1`` (a bool
    too, as ``range(True)``), a list -> its entries that name a layer index (``3``, ``"3"``; not ``"03"`` or
    ``"3.cv1"``, which freeze no whole layer), anything else (a tuple included) -> none."""
    if isinstance(freeze, list):
        return [int(s) for s in map(str, freeze) if s.isdecimal() and s == str(int(s))]
    if isinstance(freeze, int):
        return list(range(freeze))
    return []


def grid_size(stride) -> int:
    """The training size's grid, Ultralytics' ``gs``: the model's largest stride, at least 32 (mirrored:
    ``BaseTrainer._setup_train`` computes it inline, ``ultralytics/engine/trainer.py`` line 357 in 8.4.190:
    ``gs = max(int(self.model.stride.max() if hasattr(self.model, "stride") else 32), 32)``). The one copy of the
    rule: :func:`train_imgsz`, the planned run's imgsz (:func:`yolo_ckpt.memory.planned_run.planned_run`), ``plan``'s
    and the bench's largest imgsz are rounded to it.

    Args:
        stride: the model's strides (a tensor or a sequence: their maximum) or the largest stride.
    """
    if isinstance(stride, torch.Tensor):
        stride = stride.max()
    elif isinstance(stride, (list, tuple)):
        stride = max(stride)
    return max(int(stride), 32)


def train_imgsz(imgsz, stride=32) -> int:
    """The square image side (pixels) a run trains at for ``imgsz=``: Ultralytics' own rule, ``check_imgsz(imgsz,
    stride=gs, floor=gs, max_dim=1)`` with ``gs`` the :func:`grid_size` (``BaseTrainer._setup_train``): rounded up to a
    multiple of the model's largest stride, at least 32 (2736 -> 2752 at stride 32, with Ultralytics' warning), a list
    reduced to its largest side.

    Args:
        imgsz: an int, a list or tuple of sides, or their string (``"640"``, ``"[640, 480]"``).
        stride: the model's strides (a tensor: its maximum) or the largest stride.

    Raises:
        TypeError, ValueError: Ultralytics' own, naming the bad ``imgsz`` and the valid forms.
    """
    gs = grid_size(stride)
    return int(check_imgsz(imgsz, stride=gs, floor=gs, max_dim=1))


def autobatch_fraction(batch: float) -> float:
    """The fraction of the CUDA memory AutoBatch fills for ``batch=`` (-1, or a fraction in (0, 1)): the fraction
    itself, else 0.6 (mirrored: ``ultralytics/utils/autobatch.py`` ``check_train_batch_size`` computes it inline)."""
    return batch if 0.0 < batch < 1.0 else 0.6


def autobatch_imgsz(imgsz, multi_scale: float, stride: int) -> int:
    """The largest imgsz (pixels) a step trains at, which AutoBatch sizes for: ``imgsz`` rounded as
    ``BaseTrainer._setup_train`` rounds it (``check_imgsz``), x (1 + ``multi_scale``), up to the stride grid
    (mirrored: ``BaseTrainer.auto_batch`` computes it inline). ``stride``: the model's largest stride, at least 32."""
    imgsz = check_imgsz(imgsz, stride=stride, floor=stride, max_dim=1)
    return math.ceil(imgsz * (1 + multi_scale) / stride) * stride


def amp_enabled(amp, device: str) -> bool:
    """Whether a training step runs under autocast: ``amp`` not ``False``/``"fp32"`` (as ``BaseTrainer._setup_train``
    reads it) on an accelerator (``check_amp`` turns it off on the CPU and MPS). ``device``: a device type."""
    return device not in {"cpu", "mps"} and amp not in {False, "fp32"}


def optimizer_rule(name, images: int | None, batch: int, nbs: int, epochs: int) -> tuple[str, str]:
    """The optimizer whose state a run carries and the rule that picked it.

    Args:
        name: ``optimizer=`` (``auto``, ``SGD``, ``AdamW``, ...).
        images: training images (None when unknown: no ``data=``); batch, nbs, epochs: the run's keys.

    Returns:
        ``(optimizer, rule)``: the optimizer Ultralytics builds, by its name (:func:`yolo_ckpt.memory.measure.optimizer_for`:
        ``"AdamW"``, ``"MuSGD"``, ``"SGD"``, ...; :func:`yolo_ckpt.memory.measure.build_optimizer` counts its real state), and
        a sentence saying which optimizer Ultralytics will build and why.
    """
    if str(name).lower() != "auto":
        return optimizer_for(name), f"optimizer={name}"
    if images is None:
        return optimizer_for(
            "auto"
        ), "optimizer=auto: AdamW, as Ultralytics picks for up to 10000 iterations (give data= and epochs= to count them)"
    iterations = math.ceil(images / max(batch, nbs)) * epochs  # as BaseTrainer._build_train_pipeline counts them
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
        augment: the training augmentation's factors on a training image's objects (:func:`augment_factors`).
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


def augment_factors(args) -> tuple[tuple[str, int], ...]:
    """How many images' objects one training image can hold, by Ultralytics' training augmentation
    (``ultralytics/data/augment.py``, ``v8_transforms``): ``Mosaic`` (p=``mosaic``) tiles 4 images; with segments
    (segment, obb) ``CopyPaste`` (p=``copy_paste``) adds at most as many objects again (flipped copies, or one more
    mosaic's in ``copy_paste_mode=mixup``); ``MixUp`` (p=``mixup``) and ``CutMix`` (p=``cutmix``) each blend in one
    more mosaic's. ``DetectionTrainer.auto_batch`` counts x 4 only: with mixup at ``scale=0.9`` a sample held 3.8x
    the data's most in one image. Returns ``(name, factor)`` pairs of the augmentations the run turns on."""
    factors = [("mosaic", 4)] if args.mosaic > 0 else []
    if args.task in ("segment", "obb") and args.copy_paste > 0:
        factors.append(("copy_paste", 2))
    mixed = [name for name in ("mixup", "cutmix") if getattr(args, name) > 0]
    return (*factors, *((("+".join(mixed), 1 + len(mixed)),) if mixed else ()))


def count_data(args, data: dict, stride: int) -> DataCounts:
    """Build the training dataset as the task's trainer does and count its images and most objects per image
    (``cache=False``, as ``DetectionTrainer.auto_batch`` builds it; a classification set, ``ClassificationTrainer``'s
    ``ClassificationDataset``, has no objects); the global random states are left as they were.

    Args:
        args: the run's Ultralytics arguments (an ``IterableSimpleNamespace``: imgsz, task, fraction, classes, ...);
            a list imgsz is counted at its largest side (the dataset takes an int, as training sets it).
        data: the dataset dict of ``check_det_dataset`` (``check_cls_dataset`` for classify); stride: the model's
            largest stride (at least 32).
    """
    from ultralytics.data import ClassificationDataset, build_yolo_dataset
    from ultralytics.utils.patches import override_configs

    with rng_preserved(), override_configs(args, overrides={"cache": False, "imgsz": train_imgsz(args.imgsz, stride)}) as cfg:
        if cfg.task == "classify":
            return DataCounts(len(ClassificationDataset(root=data["train"], args=cfg, augment=False).samples), 0, ())
        dataset = build_yolo_dataset(cfg, data["train"], 16, data, mode="train", rect=False, stride=stride)
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
    (:data:`yolo_ckpt.memory.measure.OBJECTLESS_TASKS`), else the data's most times its augmentation's factors (x 4 for
    mosaic: :func:`augment_factors`) when counted, else ``objects``."""
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
