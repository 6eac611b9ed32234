"""The one builder of a run's memory model: from the run's keys, its model, its data and its device, the run the
estimate assumes (:class:`~yolo_ckpt.memory.runspec.RunSpec`) and the :class:`~yolo_ckpt.memory.planner.MemoryModel` that plans it.

``recompute=auto`` and ``batch=-1`` in the trainers, ``yolo-ckpt profile`` and ``plan``, and the benchmark's
planned cells (``imgsz=fit``, ``tiles.size: fit``, budget studies) all call :func:`planned_run`, so the same keys
plan the same run everywhere: the same device and AMP, the optimizer Ultralytics will build, the data's classes and
objects per image (with its augmentation's factors), the imgsz that trains and the headroom.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ..config import ESTIMATE_DEFAULTS, CkptConfig
from .runspec import RunSpec, count_data, layout_rule, objects_rule, optimizer_rule
from .ultralytics_rules import amp_enabled, autobatch_imgsz, grid_size, trainable_as_trained


@dataclass
class PlannedRun:
    """The run an estimate or plan is for, and its memory model.

    Attributes:
        model: a CPU copy of the run's model in training mode, its parameters trainable as the trainer makes them,
            ``.args`` the run's keys (the loss's hyperparameters).
        spec: what the estimate assumes and why (device, AMP, optimizer, objects per image, classes).
        imgsz: the largest size (pixels) a step trains at: ``imgsz=`` rounded to the stride, x (1 + ``multi_scale``).
        batch: the batch the memory model's base pass is estimated at (activations are rescaled from it).
        config: yolo-ckpt's keys (``loss_chunk``, ``assign_chunk``, the headroom).
        counts: the training set's images and objects (None without ``data=``).
        sizes: the :class:`~yolo_ckpt.memory.foreground.ObjectSizes` the loss is estimated with: the data's where the
            objects per image are the data's, else ``objects`` boxes of ``object_size=`` (by default the whole image:
            :func:`~yolo_ckpt.memory.runspec.layout_rule`); None for a task without boxes.
    """

    model: object
    spec: RunSpec
    imgsz: int
    batch: int
    config: CkptConfig
    counts: object = None
    sizes: object = None
    _memory: object = field(default=None, repr=False)

    @property
    def headroom(self):
        """The :class:`~yolo_ckpt.config.Headroom` a plan on this run's device keeps (none off CUDA)."""
        return self.config.headroom_on(self.spec.device)

    def memory_model(self):
        """The :class:`~yolo_ckpt.memory.planner.MemoryModel` of this run (built on first use: it calibrates the loss and
        runs one fake pass, seconds for a nano model)."""
        if self._memory is None:
            from .planner import MemoryModel

            spec = self.spec
            self._memory = MemoryModel(
                self.model, self.imgsz, self.batch, spec.objects, spec.optimizer, spec.amp, self.headroom, self.config.loss_chunk,
                self.config.assign_chunk, self.sizes,
            )
        return self._memory


def planned_run(args, model, config: CkptConfig, device: str, data: dict | None = None, *, batch: int | None = None,
                objects: int | None = None, counts=None, object_size: float | None = None) -> PlannedRun:
    """The run ``args`` describe on ``device``, for the memory model.

    Args:
        args: the run's Ultralytics keys, as ``get_cfg`` gives them (task, imgsz, multi_scale, batch, optimizer,
            nbs, epochs, amp, mosaic, copy_paste, mixup, cutmix, fraction, freeze, the loss gains, ...).
        model: the run's Ultralytics model (any device; not changed: a CPU copy is estimated).
        config: yolo-ckpt's keys, validated (:meth:`yolo_ckpt.config.CkptConfig.from_args`).
        device: the device type the run trains on (``"cuda"``, ``"cpu"``, ``"mps"``:
            :func:`yolo_ckpt.memory.ultralytics_rules.device_type`).
        data: the dataset dict the task's trainer reads (``check_det_dataset``/``check_cls_dataset``), or None.
        batch: the batch of the base pass and of the optimizer rule's iteration count (default ``args.batch``).
        objects: objects per image, given (``objects=``: it replaces the data's count); None: the data's most in one
            image times its augmentation's factors, or without ``data=`` ``cfg/estimate.yaml``'s default.
        counts: the training set's :class:`~yolo_ckpt.memory.runspec.DataCounts` where the caller counted them already.
        object_size: the largest box side, a fraction of the image's side (``object_size=``): the loss is estimated
            with boxes of that size (:func:`~yolo_ckpt.memory.runspec.layout_rule`); None: the data's sizes, or
            without them every box the whole image.

    Raises:
        ConfigError: for an optimizer Ultralytics does not build.
    """
    model = copy.deepcopy(model).cpu().train()
    trainable_as_trained(model, args.freeze)
    model.args = args  # the loss's hyperparameters
    stride = grid_size(model.stride)  # BaseTrainer._setup_train's gs
    batch = args.batch if batch is None else batch
    if counts is None and data is not None:
        counts = count_data(args, data, stride)
    n, objects_text = objects_rule(counts if objects is None else None, objects or ESTIMATE_DEFAULTS["objects"], args.task)
    optimizer, optimizer_text = optimizer_rule(args.optimizer, counts.images if counts else None, batch, args.nbs, args.epochs)
    sizes, sizes_text = layout_rule(counts, args.task, n, object_size, objects_given=objects is not None)
    spec = RunSpec(device, amp_enabled(args.amp, device), optimizer, optimizer_text, n, objects_text, int(model.yaml["nc"]), sizes_text)
    return PlannedRun(model, spec, autobatch_imgsz(args.imgsz, args.multi_scale, stride), batch, config, counts, sizes)

