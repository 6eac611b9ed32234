"""The Ultralytics rules the memory model mirrors: what a run of Ultralytics' trainer decides, decided the same way.

Each rule names the Ultralytics line it mirrors (paths under ``ultralytics/``, lines of 8.4.190, the release
``pyproject.toml``'s range starts at). Where Ultralytics computes a rule inline (inside ``BaseTrainer._setup_train``,
say) it cannot be called, so it is mirrored once, here; where it has a function of its own (``check_imgsz``,
``guess_model_task``, ``BaseTrainer.build_optimizer``), that function is called. ``tests/memory/test_ultralytics_rules.py``
checks each against Ultralytics itself: its trainer's set-up run up to the point where it has applied the rule, or
its function called.

- the tasks: :data:`TASKS`, :func:`model_task`; the input's channels: :func:`input_channels`; the anchor grid:
  :func:`anchors`; the least box side the assigner tests: :func:`stride_val`; the masks' size: :func:`mask_ratio`;
  the affine's largest scale: :func:`largest_scale` (the mask-scoring assigner's decoding chunk is the mechanism's,
  :data:`yolo_ckpt.checkpointing.assigner.DECODE_CHUNK_PIXELS`, which the memory wing reads and the mechanism, which
  may not import this wing, mirrors);
- the device and AMP: :func:`device_type`, :func:`amp_enabled`, :func:`autocast_for`;
- what trains: :func:`frozen_layers`, :func:`trainable_as_trained`;
- the image size: :func:`grid_size`, :func:`train_imgsz`; AutoBatch's: :func:`autobatch_fraction`,
  :func:`autobatch_imgsz`;
- the optimizer: :data:`OPTIMIZERS`, :func:`train_iterations`, :func:`optimizer_for`, :func:`build_optimizer`;
- the training set: :func:`training_dataset` (read-only: :func:`label_caches_in_memory`), :func:`mosaic`,
  :func:`augment_factors`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math

import torch
from ultralytics.utils.checks import check_imgsz

from ..errors import ConfigError

# what the memory model knows: training_batch builds their batches, the estimate and the planner model their steps
TASKS = ("detect", "segment", "pose", "obb", "classify", "semantic", "depth")
OBJECTLESS_TASKS = ("classify", "semantic", "depth")  # targets per image or per pixel: no objects in their batch


def model_task(model) -> str:
    """The task of an Ultralytics model, one of :data:`TASKS`: Ultralytics' own ``guess_model_task``
    (``nn/tasks.py`` line 2323), called.

    Raises:
        ValueError: naming the model's task and the tasks that are modelled.
    """
    from ultralytics.nn.tasks import guess_model_task

    task = guess_model_task(model)
    if task not in TASKS:
        raise ValueError(f"{type(model).__name__} is a {task!r} model; memory is modelled for the tasks {', '.join(TASKS)}")
    return task


def input_channels(model) -> int:
    """The channels of ``model``'s input images (1 for grayscale, 3 for colour, any other count for multispectral
    data): ``model.yaml["channels"]``, which Ultralytics' model classes set from the data's ``channels:`` key or the
    model YAML's (``nn/tasks.py`` lines 486 and 911, read); 3 for a model without one, Ultralytics' default."""
    return int((getattr(model, "yaml", None) or {}).get("channels", 3))


def anchors(imgsz: int, strides) -> int:
    """Anchor points of a detection head at ``imgsz``: sum over strides of (imgsz / stride)^2, the points
    ``make_anchors`` lays on the head's feature maps (``utils/tal.py`` line 539, mirrored: the loss calls it on
    the predictions)."""
    return int(sum((imgsz // int(s)) ** 2 for s in strides))


def stride_val(strides) -> float:
    """The least box side (pixels) the task-aligned assigner tests anchors against: sides below it are enlarged to it
    (``TaskAlignedAssigner.__init__``: ``stride[1]`` where there are several strides, ``ultralytics/utils/tal.py``
    line 59)."""
    strides = list(strides)
    return float(strides[1] if len(strides) > 1 else strides[0])


def mask_ratio(model) -> int:
    """Prototype pixels per mask pixel side of ``model``'s run: its ``args.mask_ratio``, else Ultralytics' default
    (``cfg/default.yaml``'s ``mask_ratio``, 4)."""
    from ultralytics.utils import DEFAULT_CFG

    return int(getattr(getattr(model, "args", None), "mask_ratio", DEFAULT_CFG.mask_ratio))


def scale_range(scale) -> tuple[float, float]:
    """The scales ``RandomPerspective`` draws for ``scale=`` (low, high): ``1 -+ scale``, or a range's ends
    (``ultralytics/data/augment.py`` lines 1156-1159)."""
    return (min(scale), max(scale)) if isinstance(scale, (list, tuple)) else (1 - scale, 1 + scale)


def largest_scale(scale) -> float:
    """The largest scale ``RandomPerspective`` draws for ``scale=`` (:func:`scale_range`'s high end)."""
    return scale_range(scale)[1]


def device_type(device) -> str:
    """The device type a ``device=`` value trains on, without selecting it (mirrored: ``select_device``,
    ``utils/torch_utils.py`` lines 325-327, selects and fails for a CUDA device this machine lacks): ``"cpu"``,
    ``"mps"``, or ``"cuda"`` for a CUDA index or list (``0``, ``cuda:0``, ``0,1``, ``-1``: a plan for a GPU from any
    machine); no value is the device ``train`` would use, CUDA where torch sees one, else the CPU.

    Raises:
        ConfigError: for any other value (``device=7x``), naming the valid forms.
    """
    value = str(device if device is not None else "").strip().lower()
    if value in {"cpu", "mps", "mps:0"}:
        return value[:3]
    cuda = value.removeprefix("cuda").removeprefix(":").strip("[]() ")
    if value and value != "-1" and not all(x.strip().isdigit() for x in cuda.split(",") if cuda):
        raise ConfigError(
            f"device={device!r} is not a device the memory model plans for; valid: cpu, mps, a CUDA index or list "
            "(0, cuda:0, 0,1) or -1 (an idle GPU)"
        )
    return "cuda" if value or torch.cuda.is_available() else "cpu"


def amp_enabled(amp, device: str) -> bool:
    """Whether a training step runs under autocast: ``amp`` not ``False``/``"fp32"`` (mirrored:
    ``BaseTrainer._setup_train``, ``engine/trainer.py`` line 412) on an accelerator (``check_amp`` turns it off on
    the CPU and MPS, ``utils/checks.py`` line 1009). ``device``: a device type."""
    return device not in {"cpu", "mps"} and amp not in {False, "fp32"}


def autocast_for(amp: bool, device_type: str):
    """The forward's and loss's autocast for ``amp=``: fp16 on CUDA, as Ultralytics trains (``autocast(self.amp,
    device=...)``, ``engine/trainer.py`` line 542: ``torch.autocast``'s default type); elsewhere (where Ultralytics
    turns AMP off) bf16, CPU autocast's 2-byte type; or a no-op."""
    if not amp:
        return contextlib.nullcontext
    dtype = torch.float16 if device_type == "cuda" else torch.bfloat16
    return lambda: torch.autocast(device_type, dtype=dtype)


def frozen_layers(freeze) -> list[int]:
    """Layer indices whose parameters Ultralytics' ``freeze=`` freezes, as ``BaseTrainer._setup_train`` reads it
    (mirrored: it freezes inline, by the parameter-name prefixes ``model.{x}.``, ``engine/trainer.py`` lines
    381-398): an int ``n`` -> ``0..n-1`` (a bool too, as ``range(True)``), a list -> its entries that name a layer
    index (``3``, ``"3"``; not ``"03"`` or ``"3.cv1"``, which freeze no whole layer), anything else (a tuple
    included) -> none."""
    if isinstance(freeze, list):
        return [int(s) for s in map(str, freeze) if s.isdecimal() and s == str(int(s))]
    if isinstance(freeze, int):
        return list(range(freeze))
    return []


def trainable_as_trained(model, freeze) -> None:
    """Set ``requires_grad`` on ``model``'s parameters as ``BaseTrainer._setup_train`` does before training (mirrored:
    it sets them inline, ``engine/trainer.py`` lines 381-404): off for ``freeze=``'s layers and the DFL, on for every
    other floating-point parameter (a trained ``best.pt`` is stored with them off)."""
    frozen = freeze if isinstance(freeze, list) else range(freeze) if isinstance(freeze, int) else []
    names = [f"model.{x}." for x in frozen] + [".dfl"]
    for name, p in model.named_parameters():
        p.requires_grad = not any(n in name for n in names) and p.dtype.is_floating_point


def grid_size(stride) -> int:
    """The training size's grid, Ultralytics' ``gs``: the model's largest stride, at least 32 (mirrored:
    ``BaseTrainer._setup_train`` computes it inline, ``engine/trainer.py`` line 357:
    ``gs = max(int(self.model.stride.max() if hasattr(self.model, "stride") else 32), 32)``). The one copy of the
    rule: :func:`train_imgsz`, the planned run's imgsz (:func:`yolo_ckpt.memory.planning.planned_run`), ``plan``'s
    and the bench's largest imgsz are rounded to it.

    Args:
        stride: the model's strides (a tensor or a sequence: their maximum) or the largest stride.
    """
    if isinstance(stride, torch.Tensor):
        stride = stride.max()
    elif isinstance(stride, (list, tuple)):
        stride = max(stride)
    return max(int(stride), 32)


def least_batch(imgsz: int, stride) -> int:
    """The smallest batch one training step can take at the trained ``imgsz``: 2 where the coarsest feature map (the
    model's largest stride's) is 1 x 1, else 1. BatchNorm in training needs more than one value per channel (torch's
    ``F.batch_norm``: "Expected more than 1 value per channel when training"), and Ultralytics' smallest imgsz, one
    grid, gives one image a 1 x 1 map. The one copy of the rule: the planned run's check
    (:func:`yolo_ckpt.memory.planning.planned_run`) and the largest-batch and -imgsz searches'
    (:class:`yolo_ckpt.memory.memory_model.MemoryModel`).

    Args:
        imgsz: the trained size (pixels, :func:`train_imgsz`).
        stride: the model's strides (a tensor or a sequence: their maximum) or the largest stride.
    """
    if isinstance(stride, torch.Tensor):
        stride = stride.max()
    elif isinstance(stride, (list, tuple)):
        stride = max(stride)
    return 2 if imgsz // int(stride) <= 1 else 1


def train_imgsz(imgsz, stride=32) -> int:
    """The square image side (pixels) a run trains at for ``imgsz=``: Ultralytics' own rule, ``check_imgsz(imgsz,
    stride=gs, floor=gs, max_dim=1)`` with ``gs`` the :func:`grid_size` (called as ``BaseTrainer._setup_train`` calls
    it, ``engine/trainer.py`` line 358): rounded up to a multiple of the model's largest stride, at least 32 (2736 ->
    2752 at stride 32, with Ultralytics' warning), a list reduced to its largest side.

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
    itself, else 0.6 (mirrored: ``check_train_batch_size`` computes it inline, ``utils/autobatch.py`` line 47)."""
    return batch if 0.0 < batch < 1.0 else 0.6


def autobatch_imgsz(imgsz, multi_scale: float, stride: int) -> int:
    """The largest imgsz (pixels) a step trains at, which AutoBatch sizes for: ``imgsz`` rounded as
    ``BaseTrainer._setup_train`` rounds it (``check_imgsz``), x (1 + ``multi_scale``), up to the stride grid
    (mirrored: ``BaseTrainer.auto_batch`` computes it inline, ``engine/trainer.py`` line 714). ``stride``: the
    model's largest stride, at least 32."""
    imgsz = check_imgsz(imgsz, stride=stride, floor=stride, max_dim=1)
    return math.ceil(imgsz * (1 + multi_scale) / stride) * stride


# Ultralytics' optimizer names (BaseTrainer.build_optimizer's ``optimizers`` set, engine/trainer.py line 1175, less
# "auto"), mirrored to check a name before any work starts; the optimizer itself is built by Ultralytics' builder
OPTIMIZERS = ("Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSprop", "SGD", "MuSGD")


def train_iterations(images: int, batch: int, nbs: int, epochs: int) -> int:
    """The optimizer steps of a run, as ``optimizer=auto`` counts them: ``ceil(images / max(batch, nbs)) * epochs``
    (mirrored: ``BaseTrainer._build_train_pipeline`` counts them inline, ``engine/trainer.py`` line 326)."""
    return math.ceil(images / max(batch, nbs)) * epochs


def optimizer_for(name: str = "auto", iterations: int = 0) -> str:
    """The optimizer Ultralytics builds for ``optimizer=name`` in a run of ``iterations`` optimizer steps
    (:func:`train_iterations`): ``auto`` is AdamW up to 10000 iterations and MuSGD beyond; other names are matched
    case-insensitively, as there (mirrored: ``BaseTrainer.build_optimizer`` decides it inline, ``engine/trainer.py``
    lines 1175-1184).

    Raises:
        ValueError: naming ``name`` and the valid names (:data:`OPTIMIZERS` and ``auto``).
    """
    if str(name).lower() == "auto":
        return "MuSGD" if iterations > 10000 else "AdamW"
    names = {n.lower(): n for n in OPTIMIZERS}
    if str(name).lower() not in names:
        raise ConfigError(f"optimizer={name!r} is not an Ultralytics optimizer; valid: auto, {', '.join(OPTIMIZERS)}")
    return names[str(name).lower()]


def build_optimizer(model, name: str = "AdamW", iterations: int = 0):
    """The optimizer Ultralytics trains ``model`` with, built by Ultralytics' own ``BaseTrainer.build_optimizer``
    (``engine/trainer.py`` line 1155, called on a stand-in trainer holding the default hyperparameters): its
    parameter groups, and so its state (AdamW, Adam: 2 tensors per parameter and a step; SGD: 1; RMSprop with
    momentum: 2; MuSGD: 2 for matrices and conv filters, 1 for the rest; none for parameters that do not require
    grad), are the run's. The state exists once a step has run.

    Args:
        model: the module whose parameters it optimizes (real or fake tensors).
        name, iterations: as in :func:`optimizer_for` (``auto`` resolved there).

    Raises:
        ValueError: for a name Ultralytics does not know.
    """
    from types import SimpleNamespace

    from ultralytics.cfg import DEFAULT_CFG
    from ultralytics.engine.trainer import BaseTrainer

    name = optimizer_for(name, iterations)
    trainer = SimpleNamespace(args=SimpleNamespace(**vars(DEFAULT_CFG)), data={})
    logger = logging.getLogger("ultralytics")
    level = logger.level
    logger.setLevel(logging.WARNING)  # its per-build summary line, once per estimate, is noise here
    try:
        return BaseTrainer.build_optimizer(trainer, model, name, DEFAULT_CFG.lr0, DEFAULT_CFG.momentum, DEFAULT_CFG.weight_decay)
    finally:
        logger.setLevel(level)


_LABEL_CACHES: dict | None = None  # the label caches kept in memory by the open label_caches_in_memory() block


@contextlib.contextmanager
def label_caches_in_memory():
    """Inside the block Ultralytics' datasets write no label cache (``labels/<split>.cache``) into the dataset's
    folder: what a scan would save there is kept in memory for the block and read back by a later scan of the same
    folder in it; a cache already on disk is read as usual. Ultralytics has no setting for it: the names its dataset
    module calls, ``save_dataset_cache_file`` and ``load_dataset_cache_file`` (``data/dataset.py`` lines 167, 287,
    802, 1338, 1368), are swapped for the block and put back however it ends. Nested blocks share the outer block's
    caches. Planning and checking a dataset are read-only: only training writes its cache, as stock does."""
    global _LABEL_CACHES
    if _LABEL_CACHES is not None:
        yield
        return
    from ultralytics.data import dataset

    saved = dataset.save_dataset_cache_file, dataset.load_dataset_cache_file
    caches = _LABEL_CACHES = {}

    def keep(prefix, path, x, version):
        x["version"] = version  # in place, as save_dataset_cache_file adds it: the caller pops it
        caches[str(path)] = copy.deepcopy(x)  # what the file would hold; the caller goes on to change x

    def read(path):  # a fresh dict, as a file's load gives: get_labels pops its keys
        return copy.deepcopy(caches[str(path)]) if str(path) in caches else saved[1](path)

    dataset.save_dataset_cache_file, dataset.load_dataset_cache_file = keep, read
    try:
        yield
    finally:
        dataset.save_dataset_cache_file, dataset.load_dataset_cache_file = saved
        _LABEL_CACHES = None


def training_dataset(args, data: dict, stride: int):
    """The training dataset as the task's trainer builds it for AutoBatch, with Ultralytics' own builders:
    ``build_yolo_dataset`` as ``DetectionTrainer.build_dataset`` calls it (``models/yolo/detect/train.py`` line 76)
    with ``cache=False`` and batch 16, as ``DetectionTrainer.auto_batch`` builds it (lines 251-252), and without
    ``rect`` (its labels keep their images' shapes), writing no label cache (:func:`label_caches_in_memory`); for classify
    ``ClassificationTrainer``'s ``ClassificationDataset`` (its samples: no augmentation). It draws from Python's
    global random state.

    Args:
        args: the run's Ultralytics arguments (an ``IterableSimpleNamespace``: imgsz, task, fraction, classes, ...);
            a list imgsz is built at its :func:`train_imgsz` (the dataset takes an int, as training sets it).
        data: the dataset dict of ``check_det_dataset`` (``check_cls_dataset`` for classify); stride: the model's
            largest stride (at least 32).
    """
    from ultralytics.data import ClassificationDataset, build_yolo_dataset
    from ultralytics.utils.patches import override_configs

    # rect=False: a rect dataset pops each label's image shape (``BaseDataset.set_rectangle``, ``data/base.py`` line
    # 419), which the box sizes need; its images are letterboxed to the same long side, so the boxes are the same
    overrides = {"cache": False, "imgsz": train_imgsz(args.imgsz, stride), "rect": False}
    with override_configs(args, overrides=overrides) as cfg, label_caches_in_memory():
        if cfg.task == "classify":
            return ClassificationDataset(root=data["train"], args=cfg, augment=False)
        return build_yolo_dataset(cfg, data["train"], 16, data, mode="train", rect=False, stride=stride)


def mosaic(args) -> float:
    """The probability of ``Mosaic`` in the run's training set: ``mosaic=``, or 0 with ``rect=True``
    (``YOLODataset.build_transforms``, ``data/dataset.py`` line 337, mirrored)."""
    return 0.0 if getattr(args, "rect", False) else float(args.mosaic)


def augment_factors(args) -> tuple[tuple[str, int], ...]:
    """How many images' objects one training image can hold, by Ultralytics' training augmentation (mirrored:
    ``v8_transforms``, ``data/augment.py`` lines 2871-2907): ``Mosaic`` (p=``mosaic``) tiles 4 images; with segments
    (segment, obb) ``CopyPaste`` (p=``copy_paste``) adds at most as many objects again (flipped copies, or one more
    mosaic's in ``copy_paste_mode=mixup``); ``MixUp`` (p=``mixup``) and ``CutMix`` (p=``cutmix``) each blend in one
    more mosaic's. ``DetectionTrainer.auto_batch`` counts x 4 only (``models/yolo/detect/train.py`` line 253): with
    mixup at ``scale=0.9`` a sample held 3.8x the data's most in one image. ``rect=True`` turns mosaic, mixup and
    cutmix off (``YOLODataset.build_transforms``, ``data/dataset.py`` lines 337-339). Returns ``(name, factor)`` pairs
    of the augmentations the run turns on."""
    factors = [("mosaic", 4)] if mosaic(args) > 0 else []
    if args.task in ("segment", "obb") and args.copy_paste > 0:
        factors.append(("copy_paste", 2))
    mixed = [name for name in ("mixup", "cutmix") if getattr(args, name) > 0 and not getattr(args, "rect", False)]
    return (*factors, *((("+".join(mixed), 1 + len(mixed)),) if mixed else ()))
