"""The one builder of a run's memory model, and the one decision of ``recompute=auto`` and ``batch=-1`` made with it.

From the run's keys, its model, its data and its device, :func:`planned_run` makes the run the estimate assumes
(:class:`~yolo_ckpt.memory.runspec.RunSpec`) and the :class:`~yolo_ckpt.memory.memory_model.MemoryModel` that plans it;
:meth:`PlannedRun.from_keys` first loads the model and data the keys name (``yolo-ckpt profile`` and ``plan``, the
studies in ``benchmarks/``). ``recompute=auto`` and ``batch=-1`` in the trainers, ``yolo-ckpt plan`` and the
benchmark's planned cells (``imgsz=fit``, ``tiles.size: fit``, budget studies) all call :func:`planned_run`, so the same
keys plan the same run everywhere: the same device and AMP, the optimizer Ultralytics will build, the data's classes and
objects per image (with its augmentation's factors), the imgsz that trains and the headroom; and they all decide with
:func:`decide`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpointing.policy import is_auto, resolve
from ..config import DEFAULT_MODELS, ESTIMATE_DEFAULTS, CkptConfig, EstimateOptions
from ..errors import ConfigError, user_input
from .runspec import RunSpec, count_data, layout_rule, objects_rule, optimizer_rule
from .threads import one_thread
from .ultralytics_rules import (
    amp_enabled,
    autobatch_imgsz,
    device_type,
    grid_size,
    label_caches_in_memory,
    least_batch,
    trainable_as_trained,
)

ESTIMATE_BASE_BATCH = 2  # batch=-1: the batch of the memory model's base pass (the others are rescaled from it)


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
        keys: the keys :meth:`from_keys` read, with their defaults (Ultralytics', ``cfg/estimate.yaml``'s; ``model``
            the one built); empty for a run planned from a trainer's ``args``.
    """

    model: object
    spec: RunSpec
    imgsz: int
    batch: int
    config: CkptConfig
    counts: object = None
    sizes: object = None
    keys: dict = field(default_factory=dict)
    _memory: object = field(default=None, repr=False)

    @property
    def headroom(self):
        """The :class:`~yolo_ckpt.config.Headroom` a plan on this run's device keeps (none off CUDA)."""
        return self.config.headroom_on(self.spec.device)

    def memory_model(self):
        """The :class:`~yolo_ckpt.memory.memory_model.MemoryModel` of this run (built on first use: it calibrates the loss and
        runs one fake pass, seconds for a nano model)."""
        if self._memory is None:
            from .memory_model import MemoryModel

            spec = self.spec
            self._memory = MemoryModel(
                self.model, self.imgsz, self.batch, spec.objects, spec.optimizer, spec.amp, self.headroom, self.config.loss_chunk,
                self.config.assign_chunk, self.sizes, self.config.attn_chunk, self.config.recompute_mode,
            )
        return self._memory

    @classmethod
    def from_keys(cls, keys: dict, *, plans_batch: bool = False, early: Callable | None = None, check_task: Callable | None = None,
                  check_labels: Callable | None = None) -> PlannedRun:
        """The run ``yolo-ckpt train`` would make of ``keys``, its model and data loaded as the trainer loads them.

        The model is built from ``model=`` (default: the task's, :data:`~yolo_ckpt.config.DEFAULT_MODELS`; no download, a
        ``.pt`` loaded once) with the data's classes and channels when ``data=`` is given (Ultralytics'
        ``check_det_dataset``, ``check_cls_dataset`` for classify: :func:`dataset_on_disk`), its parameters trainable
        as training makes them. The device is ``device=``, else the one ``train`` would use
        (:func:`~yolo_ckpt.memory.ultralytics_rules.device_type`); AMP as that device runs it; yolo-ckpt's keys with the task's
        defaults (:meth:`~yolo_ckpt.config.CkptConfig.for_task`). Every key is checked before the model is built.

        Args:
            keys: the keys given (``{"model": "yolo11n.yaml", "imgsz": 640, "batch": 2}``): Ultralytics' ``yolo train``
                keys, yolo-ckpt's and ``cfg/estimate.yaml``'s (``objects``, ``object_size``, ...), values as
                :func:`yolo_ckpt.cli.args.parse_train_args` gives them; the missing ones take their defaults.
            plans_batch: ``batch=-1`` asks for the batch train would pick (``yolo-ckpt plan``; :func:`decide` picks it):
                the base pass is estimated at :data:`ESTIMATE_BASE_BATCH`; False: ``batch`` must be an int >= 1.
            early: ``early(config)``, the caller's own checks of yolo-ckpt's keys before the model is built (plan's
                budget).
            check_task: ``check_task(data, task)``, the caller's check of ``data=`` for a task, called with the task
                given before the model is built and with the model's once built (train's
                :func:`~yolo_ckpt.train.inputs.check_data_for_task`).
            check_labels: ``check_labels(data, task, args)``, the caller's check of the training set (train's
                :func:`~yolo_ckpt.train.data_check.check_labels`), called once the data is counted (the label cache the
                count wrote is read, not scanned again), or when Ultralytics' dataset build fails, to say why.

        Returns:
            The run, its :attr:`keys` the keys with their defaults.

        Raises:
            ConfigError: for a bad yolo-ckpt key (:meth:`~yolo_ckpt.config.CkptConfig.from_args`), ``objects=``,
                ``format=``, ``plot=`` or ``object_size=`` (:meth:`~yolo_ckpt.config.EstimateOptions.from_args`) or
                ``batch``, a task the estimate does not cover, a model or dataset that cannot be read; the keys' errors
                before the model is built; and as ``early``, ``check_task`` and ``check_labels`` raise.
        """
        from ultralytics import YOLO
        from ultralytics.cfg import get_cfg
        from ultralytics.utils import DEFAULT_CFG, DEFAULT_CFG_DICT, LOGGER

        from ..checkpointing.model_file import layout_of
        from ..checkpointing.policy import ModelLayout
        from .ultralytics_rules import TASKS

        config = CkptConfig.from_args(keys)  # bad keys fail here, before the model is built
        opts = {**DEFAULT_CFG_DICT, **keys, **dataclasses.asdict(EstimateOptions.from_args(keys))}
        if early is not None:
            early(config)
        autobatch = plans_batch and opts["batch"] == -1  # the batch train picks, answered once the model is built
        if not autobatch and (not isinstance(opts["batch"], int) or opts["batch"] < 1):
            raise ConfigError(
                f"batch={opts['batch']!r} is not valid here; give an int >= 1"
                + (", or batch=-1 for the batch train would pick" if plans_batch else
                   " (profile estimates a given batch; plan takes batch=-1)")
            )
        opts["model"] = opts["model"] or DEFAULT_MODELS.get(opts["task"] or "detect", "yolo11n.yaml")
        if check_task is not None:
            check_task(opts["data"], keys.get("task"))
        if Path(str(opts["model"])).suffix.lower() in {".yaml", ".yml"}:
            layout_of(opts["model"])  # a missing YAML named as given (Ultralytics names 'yolo11n.yaml' for yolo11nn.yaml)
        with user_input(checkpoint=opts["model"]), one_thread():  # Ultralytics' stride probe: yolo_ckpt.memory.threads
            yolo = YOLO(opts["model"], task=keys.get("task"))
        if check_task is not None:
            check_task(opts["data"], yolo.task)
        if yolo.task not in TASKS:
            raise ConfigError(f"profile and plan estimate {', '.join(TASKS)} models; model={opts['model']} is a {yolo.task} model")
        # the task's defaults, as train takes them: its loss region where the head has one (not RT-DETR's, ...)
        layout = ModelLayout.from_model(yolo.model)
        config = config.for_task(yolo.task if layout.has_loss_region else None, keys)
        if not is_auto(config.recompute):  # a recompute= this model lacks, named before any fake pass (as train names it)
            with user_input():
                policy = resolve(config.recompute, layout)
            for line in config.policy_warnings(policy):  # as train warns
                LOGGER.warning(f"yolo-ckpt: {line}")
        args = get_cfg(DEFAULT_CFG, {k: v for k, v in opts.items() if k in DEFAULT_CFG_DICT and k != "format"} | {"task": yolo.task})
        model, data = yolo.model, None
        if opts["data"]:
            data = dataset_on_disk(opts["data"], yolo.task)
            with one_thread():
                model = yolo.task_map[yolo.task]["model"](yolo.model.yaml, nc=data["nc"], ch=data["channels"], verbose=False)
                if yolo.ckpt:  # a trained .pt: its weights, as the trainer's get_model loads them into the data's model
                    model.load(yolo.model)
        checked = check_labels is not None and data is not None
        with label_caches_in_memory():  # plan and profile leave the dataset's folder as they found it
            try:
                run = planned_run(
                    args, model, config, device_type(opts["device"]), data, batch=ESTIMATE_BASE_BATCH if autobatch else opts["batch"],
                    objects=keys.get("objects"), object_size=opts["object_size"],
                )
            except (RuntimeError, ValueError):  # Ultralytics' dataset build ("No valid images found", "No labels found"):
                # the caller's check says why, in one line
                if checked:
                    check_labels(data, yolo.task, args)
                raise
            if checked:  # from the label cache the dataset build just kept in memory: no 2nd scan
                check_labels(data, yolo.task, args)
        run.keys = opts
        return run


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
        ConfigError: for an optimizer Ultralytics does not build, and for a batch that cannot train at the imgsz: one
            image whose coarsest feature map is 1 x 1 (torch's BatchNorm refuses a training step with one value per
            channel).
    """
    with one_thread():  # a copy is memory-bound: yolo_ckpt.memory.threads
        model = copy.deepcopy(model).cpu().train()
    trainable_as_trained(model, args.freeze)
    model.args = args  # the loss's hyperparameters
    stride = grid_size(model.stride)  # BaseTrainer._setup_train's gs
    batch = args.batch if batch is None else batch
    imgsz = autobatch_imgsz(args.imgsz, args.multi_scale, stride)
    if batch == 1 and least_batch(imgsz, model.stride) > 1:
        coarsest = int(max(model.stride))
        raise ConfigError(
            f"batch=1 at imgsz={imgsz} cannot train: the coarsest feature map (stride {coarsest}) is 1 x 1, and BatchNorm needs more "
            f"than one value per channel in training; give batch>=2 or imgsz>={-(-2 * coarsest // stride) * stride}"
        )
    if counts is None and data is not None:
        counts = count_data(args, data, stride)
    n, objects_text = objects_rule(counts if objects is None else None, objects or ESTIMATE_DEFAULTS["objects"], args.task)
    optimizer, optimizer_text = optimizer_rule(args.optimizer, counts.images if counts else None, batch, args.nbs, args.epochs)
    sizes, sizes_text = layout_rule(counts, args.task, n, object_size, objects_given=objects is not None)
    spec = RunSpec(device, amp_enabled(args.amp, device), optimizer, optimizer_text, n, objects_text, int(model.yaml["nc"]), sizes_text)
    return PlannedRun(model, spec, imgsz, batch, config, counts, sizes)


def dataset_on_disk(data: str, task: str) -> dict:
    """The dataset dict the task's trainer reads (Ultralytics' ``check_det_dataset``, ``check_cls_dataset`` for
    classify), without downloading anything or running a data.yaml's ``download:`` code: profile and plan only estimate.

    Raises:
        ConfigError: naming ``data=`` when the dataset is not on disk (and how to fetch it), or cannot be read.
    """
    from ultralytics.data.utils import check_cls_dataset, check_det_dataset

    fetch = (
        f"data={data} is not on disk; profile and plan never download: fetch it first "
        f"(yolo-ckpt train or yolo train data={data} downloads it)"
    )
    with user_input():
        if task != "classify":
            try:
                return check_det_dataset(data, autodownload=False)
            except FileNotFoundError as e:
                raise ConfigError(f"{fetch}: {str(e).splitlines()[0]}") from e
        if not Path(data).is_dir():
            raise ConfigError(fetch)
        return check_cls_dataset(data)


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` made of ``recompute=`` and ``batch=``.

    Attributes:
        recompute: the ``recompute=`` that trains: the plan's units for ``auto`` (``"0-4,head"``), ``"all"`` for ``auto``
            with ``batch=-1``, else as given (a spec or a :class:`~yolo_ckpt.checkpointing.policy.RecomputePolicy`).
        batch: the batch that trains: ``batch=-1``'s pick, else as given (-1 where no memory model was given).
        plan: ``auto``'s :class:`~yolo_ckpt.memory.memory_model.Plan` at a given batch, else None.
    """

    recompute: object
    batch: int
    plan: object = None


def decide(recompute, batch: int, memory=None, budget: int | None = None, imgsz: int | None = None,
           images: int | None = None) -> Decision:
    """The one decision of ``recompute=auto`` and ``batch=-1`` (or a fraction: any batch < 1), which the trainers,
    ``yolo-ckpt plan`` and the bench's cells make alike:

    - ``batch=-1`` with ``recompute=auto``: recompute everything (``all``), then take the largest batch that fits (the
      policy cannot be planned before the batch, nor the batch picked before the policy);
    - ``batch=-1``: the largest batch whose estimated peak with the policy, plus the headroom, fits ``budget`` at
      ``imgsz``, capped by the training set's ``images`` and AutoBatch's 1024 (``MemoryModel.largest_batch``);
    - ``recompute=auto`` at a given batch: the cheapest plan that fits (:meth:`~yolo_ckpt.memory.memory_model.MemoryModel.plan`).

    Args:
        recompute: the ``recompute=`` value, or a :class:`~yolo_ckpt.checkpointing.policy.RecomputePolicy` applied.
        batch: ``batch=`` as given.
        memory: the run's :class:`~yolo_ckpt.memory.memory_model.MemoryModel`; None to make only the decision that needs no
            estimate (``auto`` with ``batch=-1`` is ``all``; the trainer on CUDA then measures its batch with AutoBatch),
            the rest kept as given.
        budget: ``memory_budget=`` in bytes.
        imgsz: the largest size a step trains at (pixels).
        images: the training set's images (None: no data, no cap).

    Raises:
        PlanError: when not even batch 1 fits (saying the need and the largest imgsz batch 1 fits), or no plan fits at
            the batch (:meth:`~yolo_ckpt.memory.memory_model.MemoryModel.nothing_fits`).
    """
    auto = is_auto(recompute)
    if batch < 1 and auto:
        recompute = "all"
    if memory is None:
        return Decision(recompute, batch)
    if batch < 1:
        from .memory_model import PlanError, size_text

        units = memory.units(recompute)
        batch = memory.largest_batch(units, budget, imgsz, images)
        if batch < 1:  # the search's fake pass of batch 1 did not fit: its need, and the largest imgsz batch 1 fits
            need = memory.headroom.need(memory.estimate(memory.spec(units), 1, imgsz).peak_bytes)
            sizes = memory.largest_imgsz(units, budget, 1)
            raise PlanError(
                f"memory_budget={size_text(budget)} is below batch=1's estimated need of {size_text(need)} at imgsz={imgsz} with "
                f"recompute={memory.spec(units)}; it fits " + (f"imgsz={sizes} at batch=1" if sizes else "no imgsz at batch=1")
            )
        return Decision(recompute, batch)
    if not auto:
        return Decision(recompute, batch)
    plan = memory.plan(budget, batch, imgsz, images)
    return Decision(plan.recompute, batch, plan)

