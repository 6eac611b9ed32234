"""Checkpoint*Trainer: Ultralytics' task trainers with activation checkpointing applied where the model is built.

The policy is applied in ``setup_model``, the first step of ``BaseTrainer._setup_train``, so the model that
``attempt_compile``, the freeze step, ``DistributedDataParallel``, AutoBatch (``batch=-1``) and ``ModelEMA``
(a ``deepcopy``) see is already patched. ``setup_model`` runs in every path: ``Model.train(trainer=...)`` (which
builds the model with ``get_model`` beforehand), a bare ``trainer.train()``, ``resume=True`` and each DDP worker
(which receives a pickled, hence stock, model).

yolo-ckpt's own keys (``yolo_ckpt/cfg/default.yaml``) are taken out of ``overrides`` before Ultralytics' argument
check sees them, validated before the run directory is created, and set on ``trainer.args`` afterwards. So they
are saved in ``args.yaml`` and in ``last.pt``'s ``train_args`` (which ``resume=True`` and the DDP launcher read
back), while the saved model holds only stock Ultralytics classes.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from ultralytics.models.yolo.classify import ClassificationTrainer
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.models.yolo.obb import OBBTrainer
from ultralytics.models.yolo.pose import PoseTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer
from ultralytics.utils import DEFAULT_CFG, LOGGER, RANK, YAML, IterableSimpleNamespace, colorstr
from ultralytics.utils.patches import override_configs
from ultralytics.utils.torch_utils import unwrap_model

from . import report
from .engine import apply_checkpointing
from .losses import check_loss_chunk
from .memory import optimizer_for
from .planner import MemoryModel, parse_budget
from .policy import check_mode, check_spec, is_auto, layout_of, resolve

DEFAULTS_PATH = Path(__file__).parent / "cfg" / "default.yaml"
DEFAULTS: dict = YAML.load(DEFAULTS_PATH)
PREFIX = colorstr("yolo-ckpt: ")


def frozen_layers(freeze) -> list[int]:
    """Layer indices that Ultralytics' ``freeze=`` freezes, as ``BaseTrainer._setup_train`` reads it: an int ``n``
    -> ``0..n-1``, a list -> its integer entries, anything else (a tuple included) -> none."""
    if isinstance(freeze, list):
        return [int(x) for x in freeze if str(x).isdigit()]
    if isinstance(freeze, int) and not isinstance(freeze, bool):
        return list(range(freeze))
    return []


def _model_source(overrides: dict):
    """The checkpoint or YAML the trainer will build its model from: the resumed ``last.pt``, else ``model=``."""
    resume = overrides.get("resume")
    if isinstance(resume, (str, Path)) and Path(resume).is_file():
        return resume
    return overrides.get("model")


@contextlib.contextmanager
def rng_preserved():
    """Put Python's, NumPy's and torch's (CPU) global random states back on exit. Planning builds the training
    dataset to count its objects, which draws from ``random``; training must then draw the same numbers (the same
    augmentations) as it would without planning, or recompute=auto would not train exactly as stock."""
    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])


def _on_train_batch_start(trainer) -> None:
    trainer.ckpt_stats["t0"] = time.perf_counter()


def _on_train_batch_end(trainer) -> None:
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    trainer.ckpt_stats["step_s"].append(time.perf_counter() - trainer.ckpt_stats["t0"])


def _on_train_end(trainer) -> None:
    report.write_run_report(trainer)


CALLBACKS = {
    "on_train_batch_start": _on_train_batch_start,
    "on_train_batch_end": _on_train_batch_end,
    "on_train_end": _on_train_end,
}


class CheckpointTrainerMixin:
    """Adds activation checkpointing and the run report to an Ultralytics task trainer (place it first).

    Attributes:
        task_defaults: yolo-ckpt keys whose default differs for this task from ``cfg/default.yaml``.
    """

    task_defaults: dict = {}

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        """Take yolo-ckpt's keys out of ``overrides``/``cfg``, validate them, then build the Ultralytics trainer.

        Raises:
            ValueError: for an invalid ``recompute=``, ``recompute_mode=`` or ``loss_chunk=`` value, before any file
                or folder is written.
        """
        overrides = dict(overrides or {})
        given = {k: overrides.pop(k) for k in DEFAULTS if k in overrides}
        check_mode(given.get("recompute_mode", DEFAULTS["recompute_mode"]))
        check_loss_chunk(given.get("loss_chunk", DEFAULTS["loss_chunk"]))
        self._check_planning(given, overrides)
        if "recompute" in given:
            source = _model_source(overrides)
            if source and not is_auto(given["recompute"]):  # the model's own errors, before any file is written
                resolve(given["recompute"], layout_of(source))
            else:
                check_spec(given["recompute"])
        super().__init__(cfg, overrides, _callbacks)
        # given > restored by resume (train_args) > this task's default > default
        for k, default in {**DEFAULTS, **self.task_defaults}.items():
            setattr(self.args, k, given.get(k, getattr(self.args, k, default)))
        if RANK in {-1, 0}:
            YAML.save(self.save_dir / "args.yaml", vars(self.args))  # again, now with yolo-ckpt's keys
        self.policy = self.plan = None
        self.ckpt_stats = {"step_s": [], "probe_batch": None, "train_peak": {}, "val_peak": {}}
        for event, callback in CALLBACKS.items():  # the DDP worker gets them back in _callbacks already
            if callback not in self.callbacks[event]:
                self.add_callback(event, callback)

    def _check_planning(self, given: dict, overrides: dict) -> None:
        """recompute=auto and batch=-1 need a budget on the CPU and a detection model; check before any write."""
        auto = is_auto(given.get("recompute", ""))
        autobatch = float(overrides.get("batch", DEFAULT_CFG.batch)) < 1
        cpu = str(overrides.get("device", "")).lower() == "cpu" or not torch.cuda.is_available()
        if given.get("memory_budget") is not None:
            parse_budget(given["memory_budget"], None if cpu else 1)  # the form only: the device is not set up yet
        what = "recompute=auto" if auto else "batch=-1" if autobatch else None
        if what and cpu and given.get("memory_budget") is None:
            raise ValueError(f"{what} on the CPU needs memory_budget= (bytes with a unit, e.g. memory_budget=8GB)")
        if what and isinstance(self, (SegmentationTrainer, OBBTrainer, PoseTrainer, ClassificationTrainer)):
            raise ValueError(f"{what} plans memory for detection models; for this task give a named policy and a batch")

    def _budget(self) -> int:
        """memory_budget= in bytes; on CUDA by default batch=-1's fraction (AutoBatch's 0.6) of the memory available."""
        available = None
        if self.device.type == "cuda":  # as AutoBatch counts it: free memory plus what this process has reserved
            available = torch.cuda.mem_get_info(self.device)[0] + torch.cuda.memory_reserved(self.device)
        if self.args.memory_budget is not None:
            return parse_budget(self.args.memory_budget, available)
        return int((self.args.batch if 0 < self.args.batch < 1 else 0.6) * available)

    def _memory_model(self, batch: int):
        """The planner's memory model of this run's model at its imgsz, with the dataset's most objects per image
        (x4 for mosaic, as Ultralytics' AutoBatch counts them)."""
        with rng_preserved(), override_configs(self.args, overrides={"cache": False}) as self.args:
            dataset = self.build_dataset(self.data["train"], mode="train", batch=16)
        objects = max(len(label["cls"]) for label in dataset.labels) * 4
        model = copy.deepcopy(unwrap_model(self.model)).cpu()
        model.args = self.args  # the loss's hyperparameters (set_model_attributes has not run yet in setup_model)
        amp = self.device.type == "cuda" and self.args.amp not in {False, "fp32"}
        iterations = math.ceil(len(dataset) / max(batch, self.args.nbs)) * self.epochs  # as build_optimizer counts
        optimizer = optimizer_for(self.args.optimizer, iterations)
        return MemoryModel(model, self.args.imgsz, batch, objects=max(objects, 1), optimizer=optimizer, amp=amp)

    def _plan_recompute(self) -> str:
        """recompute=auto: the cheapest layer set that fits the budget at this run's batch and imgsz."""
        if self.args.batch < 1:
            LOGGER.info(f"{PREFIX}recompute=auto with batch=-1: recompute every layer, then take the largest batch")
            return "all"
        self.plan = self._memory_model(self.args.batch).plan(self._budget(), self.args.batch, self.args.imgsz)
        LOGGER.info(
            f"{PREFIX}plan for memory_budget={self.plan.budget_bytes / 2**30:.2f} GiB: recompute={self.plan.recompute}, "
            f"estimated peak {self.plan.estimated_peak_bytes / 2**30:.2f} GiB at batch={self.plan.batch} "
            f"imgsz={self.plan.imgsz}, recompute cost {self.plan.recompute_cost:.1%} of a step's FLOPs"
        )
        return self.plan.recompute

    def auto_batch(self):
        """batch=-1 (or a fraction): the largest batch whose estimated peak, with the policy applied, fits the
        budget; on any device (Ultralytics' AutoBatch profiles CUDA only, and the unpatched model's needs).

        Raises:
            ValueError: when not even batch 1 fits, saying the need.
        """
        budget, imgsz = self._budget(), self.args.imgsz
        memory = self._memory_model(2)
        batch = memory.largest_batch(self.policy.indices, budget, imgsz)
        if batch < 1:
            need = memory.peak(self.policy.indices, 1, imgsz)
            raise ValueError(f"memory_budget={budget / 2**30:.2f} GiB is below batch=1's estimated need of {need / 2**30:.2f} GiB at imgsz={imgsz} with {self.policy}")
        LOGGER.info(f"{PREFIX}batch={batch}: the largest that fits memory_budget={budget / 2**30:.2f} GiB at imgsz={imgsz} ({self.policy.spec})")
        self.plan = self.plan or memory.as_plan(self.policy.indices, memory.peak(self.policy.indices, batch, imgsz), budget, batch, imgsz)
        return batch

    def setup_model(self):
        """Build or load the model as Ultralytics does, then apply the recompute policy and log it."""
        ckpt = super().setup_model()
        recompute = self.args.recompute
        if is_auto(recompute):
            recompute = self._plan_recompute()
        self.policy = apply_checkpointing(
            self.model,
            recompute,
            frozen=frozen_layers(self.args.freeze),
            mode=self.args.recompute_mode,
            loss_chunk=self.args.loss_chunk,
        )
        if RANK in {-1, 0}:
            LOGGER.info(f"{PREFIX}activation checkpointing {self.policy}")
            if not (self.policy.indices or self.policy.regions()) and self.policy.spec != "none":
                LOGGER.warning(f"{PREFIX}recompute={self.policy.spec} selects no layer with trainable parameters")
        return ckpt

    def preprocess_batch(self, batch):
        """Ultralytics' preprocessing; on the CPU the first batch is kept for the end-of-run memory probe."""
        batch = super().preprocess_batch(batch)
        if self.device.type == "cpu" and self.ckpt_stats["probe_batch"] is None:
            self.ckpt_stats["probe_batch"] = dict(batch)
        return batch

    def get_validator(self):
        """Ultralytics' validator, built from the args without yolo-ckpt's keys (its argument check rejects them)."""
        args = self.args
        self.args = IterableSimpleNamespace(**{k: v for k, v in vars(args).items() if k not in DEFAULTS})
        try:
            return super().get_validator()
        finally:
            self.args = args

    def validate(self):
        """Ultralytics' validation, with CUDA peak memory kept apart from training's."""
        with report.cuda_peak(self, "val"):
            return super().validate()

    def final_eval(self):
        """Ultralytics' final validation of ``best.pt``, with its CUDA peak counted as validation."""
        with report.cuda_peak(self, "val"):
            super().final_eval()

    def memory_probes(self) -> tuple[int, int]:
        """CPU: peak live-tensor bytes of one training step and one validation batch of the final model.

        Returns:
            ``(train_bytes, val_bytes)``; the validation batch is the validation loader's batch size.
        """
        from .memory import probe_training_step, probe_validation_step

        batch = self.ckpt_stats["probe_batch"]
        model = unwrap_model(self.model)
        val_batch = self.test_loader.batch_size or len(batch["img"])
        images = batch["img"].repeat((val_batch + len(batch["img"]) - 1) // len(batch["img"]), 1, 1, 1)[:val_batch]
        return probe_training_step(model, batch), probe_validation_step(self.ema.ema, images)


class CheckpointDetectionTrainer(CheckpointTrainerMixin, DetectionTrainer):
    """``DetectionTrainer`` with activation checkpointing (``recompute=``) and a run report."""


class CheckpointSegmentationTrainer(CheckpointTrainerMixin, SegmentationTrainer):
    """``SegmentationTrainer`` with activation checkpointing (``recompute=``) and a run report.

    Its default is ``recompute=backbone,loss``: the loss region (:mod:`yolo_ckpt.losses`) is exact and, with many
    objects per image, frees more memory than any layer policy.
    """

    task_defaults = {"recompute": "backbone,loss"}


class CheckpointOBBTrainer(CheckpointTrainerMixin, OBBTrainer):
    """``OBBTrainer`` with activation checkpointing (``recompute=``) and a run report."""


class CheckpointPoseTrainer(CheckpointTrainerMixin, PoseTrainer):
    """``PoseTrainer`` with activation checkpointing (``recompute=``) and a run report."""


class CheckpointClassificationTrainer(CheckpointTrainerMixin, ClassificationTrainer):
    """``ClassificationTrainer`` with activation checkpointing (``recompute=``) and a run report."""


TRAINERS = {
    "detect": CheckpointDetectionTrainer,
    "segment": CheckpointSegmentationTrainer,
    "obb": CheckpointOBBTrainer,
    "pose": CheckpointPoseTrainer,
    "classify": CheckpointClassificationTrainer,
}


def trainer_for(task: str) -> type:
    """The Checkpoint*Trainer class for an Ultralytics task name.

    Raises:
        ValueError: for any other task (semantic, depth, and the RT-DETR, World and YOLOE trainers are not
            supported), naming the supported tasks.
    """
    if task not in TRAINERS:
        raise ValueError(f"task={task!r} is not supported by yolo-ckpt; supported tasks: {list(TRAINERS)}")
    return TRAINERS[task]
