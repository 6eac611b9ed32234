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

import time
from pathlib import Path

import torch
from ultralytics.models.yolo.classify import ClassificationTrainer
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.models.yolo.obb import OBBTrainer
from ultralytics.models.yolo.pose import PoseTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer
from ultralytics.utils import DEFAULT_CFG, LOGGER, RANK, YAML, IterableSimpleNamespace, colorstr
from ultralytics.utils.torch_utils import unwrap_model

from . import report
from .engine import apply_checkpointing
from .policy import check_mode, check_spec, layout_of, resolve

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
    """Adds activation checkpointing and the run report to an Ultralytics task trainer (place it first)."""

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        """Take yolo-ckpt's keys out of ``overrides``/``cfg``, validate them, then build the Ultralytics trainer.

        Raises:
            ValueError: for an invalid ``recompute=`` or ``recompute_mode=`` value, before any file or folder is
                written.
        """
        overrides = dict(overrides or {})
        given = {k: overrides.pop(k) for k in DEFAULTS if k in overrides}
        check_mode(given.get("recompute_mode", DEFAULTS["recompute_mode"]))
        if "recompute" in given:
            source = _model_source(overrides)
            if source:  # the model's own errors (sections, names, indices), before any file is written
                resolve(given["recompute"], layout_of(source))
            else:
                check_spec(given["recompute"])
        super().__init__(cfg, overrides, _callbacks)
        for k, default in DEFAULTS.items():  # given > restored by resume (train_args) > default
            setattr(self.args, k, given.get(k, getattr(self.args, k, default)))
        if RANK in {-1, 0}:
            YAML.save(self.save_dir / "args.yaml", vars(self.args))  # again, now with yolo-ckpt's keys
        self.policy = None
        self.ckpt_stats = {"step_s": [], "probe_batch": None, "train_peak": {}, "val_peak": {}}
        for event, callback in CALLBACKS.items():  # the DDP worker gets them back in _callbacks already
            if callback not in self.callbacks[event]:
                self.add_callback(event, callback)

    def setup_model(self):
        """Build or load the model as Ultralytics does, then apply the recompute policy and log it."""
        ckpt = super().setup_model()
        self.policy = apply_checkpointing(
            self.model, self.args.recompute, frozen=frozen_layers(self.args.freeze), mode=self.args.recompute_mode
        )
        if RANK in {-1, 0}:
            LOGGER.info(f"{PREFIX}activation checkpointing {self.policy}")
            if not self.policy.indices and self.policy.spec != "none":
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
    """``SegmentationTrainer`` with activation checkpointing (``recompute=``) and a run report."""


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
