"""Checkpoint*Trainer: Ultralytics' task trainers with activation checkpointing applied where the model is built.

The policy is applied in ``setup_model``, the first step of ``BaseTrainer._setup_train``, so the model that
``attempt_compile``, the freeze step, ``DistributedDataParallel`` and ``ModelEMA`` (a ``deepcopy``) see is already
patched. ``batch=-1`` goes through :meth:`CheckpointTrainerMixin.auto_batch`, which overrides Ultralytics': on CUDA
it runs Ultralytics' AutoBatch on the patched model (beside the memory model's batch), on the CPU with
``memory_budget=`` it takes the memory model's batch, on the CPU without one stock AutoBatch's batch 16.
``setup_model`` runs in every path: ``Model.train(trainer=...)`` (which builds the model with ``get_model``
beforehand), a bare ``trainer.train()``, ``resume=True`` and each DDP worker (which receives a pickled, hence stock,
model).

yolo-ckpt's own keys (``yolo_ckpt/cfg/default.yaml``) are taken out of ``overrides`` before Ultralytics' argument
check sees them, validated (:meth:`yolo_ckpt.config.CkptConfig.from_args`) before the run directory is created, and
set on ``trainer.args`` afterwards, as given. So they are saved in ``args.yaml`` and in ``last.pt``'s
``train_args`` (which ``resume=True`` and the DDP launcher read back), while the saved model holds only stock
Ultralytics classes. The trainer reads them typed from ``trainer.ckpt_config``, built once the run's values are
final (given, else resumed, else the task's default, else the YAML's). What the run plans and measures is on
``trainer.ckpt_state`` (:class:`yolo_ckpt.train.state.RunState`), the policy applied on ``trainer.policy``.
"""

from __future__ import annotations

import contextlib
import functools

from ultralytics.cfg import get_cfg
from ultralytics.engine.trainer import BaseTrainer
from ultralytics.models.yolo.classify import ClassificationTrainer
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.models.yolo.obb import OBBTrainer
from ultralytics.models.yolo.pose import PoseTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer
from ultralytics.utils import DEFAULT_CFG, LOGGER, RANK, YAML, IterableSimpleNamespace

from ..checkpointing.engine import apply_checkpointing
from ..checkpointing.policy import is_auto
from ..config import DEFAULTS, CkptConfig
from ..errors import ConfigError
from ..memory import frozen_layers
from ..report.record import RunReport
from . import distributed, exact_resume, run_dir, run_stats
from .atomic import atomic_saves, remove_stale_temporaries
from .data_check import check_train_labels
from .inputs import check_model_keys, check_train_inputs
from .log import PREFIX
from .planning import check_planning, plan_recompute, planned_batch
from .resume import stop_on_interrupt
from .run_dir import claim_run_dir, held_run_dir, noted_writes, restored_on_failure
from .run_stats import add_callbacks, keep_probe_batch, validating
from .state import RunState
from .tasks import task_defaults, task_of

# batch=-1 on the CPU without a budget: what stock does, said once
STOCK_BATCH = (
    "batch=-1 on the CPU without memory_budget=: AutoBatch's default batch 16, as stock; "
    "memory_budget= plans the largest batch that fits"
)


def apply_recompute(trainer, recompute):
    """Apply ``recompute`` (a ``recompute=`` value, not ``auto``) to ``trainer.model`` with the run's frozen layers,
    ``recompute_mode`` and chunks, replacing the policy before (:func:`~yolo_ckpt.checkpointing.engine.apply_checkpointing`);
    ``trainer.policy``, the run's plan, is left as it was. Returns the policy applied. The trainer's method
    ``apply_recompute``: its ``setup_model`` calls it, as does a schedule that changes the recomputation while the run
    trains (:mod:`yolo_ckpt.bench.hybrid`)."""
    config = trainer.ckpt_config
    return apply_checkpointing(
        trainer.model, recompute, frozen=frozen_layers(trainer.args.freeze), mode=config.recompute_mode,
        loss_chunk=config.loss_chunk, assign_chunk=config.assign_chunk, attn_chunk=config.attn_chunk,
    )


class CheckpointTrainerMixin(exact_resume.ExactResume, run_dir.RunFolder):
    """Adds activation checkpointing and the run report to an Ultralytics task trainer (place it first). Only the hooks
    into Ultralytics: what they do is in :mod:`yolo_ckpt.train`'s other modules (planning, run_dir, run_stats, atomic,
    distributed, exact_resume), as functions of the trainer."""

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        """Take yolo-ckpt's keys out of ``overrides``/``cfg``, validate them, then build the Ultralytics trainer.

        Raises:
            ConfigError: for an invalid yolo-ckpt key or input (:meth:`check_keys`) or training set
                (:func:`~yolo_ckpt.train.data_check.check_train_labels`), or run folder (another live run's, read-only:
                :func:`~yolo_ckpt.train.run_dir.claim_run_dir`), before any file or folder is written. Whatever
                Ultralytics' trainer raises while it is built (a missing ``data=``: RuntimeError), after this run's
                writes into the run folder are undone (:func:`~yolo_ckpt.train.run_dir.restored_on_failure`).
        """
        config, given, overrides = self.check_keys(overrides)
        if RANK in {-1, 0}:
            check_train_labels(type(self), task_of(type(self)), get_cfg(cfg, overrides))
        before, overrides = claim_run_dir(cfg, overrides)  # a second live run into the folder refused before any write
        self.ckpt_state = state = RunState(run_dir_before=before, lock=before.lock if before else None)
        # e.g. a data= that does not exist: Ultralytics wrote args.yaml, removed results.csv; only those writes are undone
        with restored_on_failure(self), noted_writes(state.run_dir_before):
            super().__init__(cfg, overrides, _callbacks)
            if distributed.torchrun_world_size() > 1:  # a torchrun worker: the whole job's ranks, on every node
                self.world_size = distributed.torchrun_world_size()
            # given > restored by resume (train_args) > this task's default > default
            for k, default in {**DEFAULTS, **task_defaults(type(self))}.items():
                setattr(self.args, k, given.get(k, getattr(self.args, k, default)))
            # typed (the raw values stay on args for args.yaml); a resumed run's own keys are read back from last.pt
            self.ckpt_config = CkptConfig.from_args(vars(self.args)) if self.args.resume else config
            if RANK in {-1, 0}:
                YAML.save(self.save_dir / "args.yaml", vars(self.args))  # again, now with yolo-ckpt's keys
                remove_stale_temporaries(self.wdir)  # of this run's saves a kill interrupted
        self.policy = None
        add_callbacks(self)
        add_callbacks(self, exact_resume.CALLBACKS)

    @classmethod
    def check_keys(cls, overrides: dict | None) -> tuple[CkptConfig, dict, dict]:
        """Split ``overrides`` into yolo-ckpt's keys and Ultralytics' and build the typed config of yolo-ckpt's (the
        one check, :meth:`yolo_ckpt.config.CkptConfig.from_args`; the CLI's and the trainer's ask for the same), and
        check a ``recompute=`` against the model that ``model=`` names where reading it costs nothing: a YAML, or the
        loaded model's YAML dict the CLI passes. A ``.pt`` is not unpickled again here (Ultralytics loaded it
        once): its policy is resolved in :meth:`setup_model`, the run directory put back if it fails.

        Returns:
            ``(config, yolo-ckpt's keys given, the other overrides)``.

        Raises:
            ConfigError: for an invalid ``recompute=``, ``recompute_mode=``, ``loss_chunk=``, ``assign_chunk=``, ``attn_chunk=``,
                ``memory_budget=`` or ``memory_headroom=``, a ``recompute=`` the model does not have
                (:func:`yolo_ckpt.checkpointing.policy.resolve`), a planning request this task or device cannot
                honour (:func:`~yolo_ckpt.train.planning.check_planning`), an RT-DETR model given to a trainer other
                than RTDETRTrainer's, ``resume=`` a finished run's ``last.pt`` (:func:`~yolo_ckpt.train.inputs.check_model_keys`),
                or a bad ``imgsz=``, ``device=``, ``project=`` or ``model=``
                (:func:`yolo_ckpt.train.inputs.check_train_inputs`); before anything is written.
        """
        overrides = dict(overrides or {})
        check_train_inputs(overrides)
        given = {k: overrides.pop(k) for k in DEFAULTS if k in overrides}
        config = CkptConfig.from_args(given, task_of(cls) if task_defaults(cls) else None)  # RT-DETR, World, YOLOE: no loss region
        check_planning(cls, task_of(cls), config, overrides)
        check_model_keys(cls, overrides, config, given)
        return config, given, overrides

    def auto_batch(self):
        """batch=-1 (or a fraction), with the recompute policy already applied to ``self.model``: on the CPU without
        ``memory_budget=`` stock (AutoBatch's default batch 16, with its warning, no dataset cap); else the memory
        model's batch, or on CUDA AutoBatch's on the patched model (:func:`~yolo_ckpt.train.planning.planned_batch`)."""
        if self.device.type != "cuda" and self.ckpt_config.memory_budget is None:
            LOGGER.warning(f"{PREFIX}{STOCK_BATCH}")
            return super().auto_batch()
        return planned_batch(self)

    def setup_model(self):
        """Build or load the model as Ultralytics does, then apply the recompute policy (``recompute=auto``: planned,
        :func:`~yolo_ckpt.train.planning.plan_recompute`) and log it."""
        ckpt = super().setup_model()
        config = self.ckpt_config
        self.policy = self.apply_recompute(plan_recompute(self) if is_auto(config.recompute) else config.recompute)
        if RANK in {-1, 0}:
            LOGGER.info(f"{PREFIX}activation checkpointing {self.policy}")
            for line in config.policy_warnings(self.policy):
                LOGGER.warning(f"{PREFIX}{line}")
        return ckpt

    apply_recompute = apply_recompute  # a method: setup_model's, and a schedule's that changes it mid-run

    def preprocess_batch(self, batch):
        """Ultralytics' preprocessing; on the CPU the batch for the end-of-run memory probe is kept
        (:func:`~yolo_ckpt.train.run_stats.keep_probe_batch`)."""
        batch = super().preprocess_batch(batch)
        keep_probe_batch(self, batch)
        return batch

    def train(self):
        """Ultralytics' training, the run folder locked (:func:`~yolo_ckpt.train.run_dir.held_run_dir`). Whatever fails
        before the first epoch starts (set-up, the dataset, planning's PlanError) undoes this run's writes into the run
        folder, then is raised. Ctrl-C stops it within a step, saying what resumes (:func:`~yolo_ckpt.train.resume.stop_on_interrupt`)."""
        with held_run_dir(self), stop_on_interrupt(self):
            return super().train()

    def _setup_ddp(self):
        """Ultralytics' process-group set-up on GPUs; on the CPU a gloo group (:mod:`yolo_ckpt.train.distributed`)."""
        if self.device.type != "cpu":
            return super()._setup_ddp()
        distributed.init_cpu_process_group(self.world_size)

    def _setup_train(self):
        """Ultralytics' set-up; on the CPU under torchrun its DDP wrap builds a CPU DDP (:func:`~yolo_ckpt.train.distributed.cpu_ddp`)."""
        with distributed.cpu_ddp() if self.device.type == "cpu" and self.world_size > 1 else contextlib.nullcontext():
            return super()._setup_train()

    def save_model(self):
        """Ultralytics' ``save_model``, with ``last.pt``/``best.pt``/``epochN.pt`` written atomically: a kill during
        the write leaves the previous complete checkpoint (:mod:`yolo_ckpt.train.atomic`). Notes the epoch ``best.pt``
        is written for first, so that the exact resume state saved with ``last.pt`` has it."""
        if self.best_fitness == self.fitness:  # BaseTrainer.save_model's rule for writing best.pt (engine/trainer.py)
            self.ckpt_state.best_epoch = self.epoch + 1
        with atomic_saves(self.wdir):
            return super().save_model()

    def get_validator(self):
        """Ultralytics' validator, built from the args without yolo-ckpt's keys (its argument check rejects them)."""
        args = self.args
        self.args = IterableSimpleNamespace(**{k: v for k, v in vars(args).items() if k not in DEFAULTS})
        try:
            return super().get_validator()
        finally:
            self.args = args

    def validate(self):
        """Ultralytics' validation, its time and CUDA peak memory kept apart from training's (:func:`validating`)."""
        with validating(self):
            return super().validate()

    def final_eval(self):
        """Ultralytics' final validation of ``best.pt``: its time and CUDA peak counted as validation's (:func:`validating`),
        its ``strip_optimizer`` rewrites of ``last.pt`` and ``best.pt`` atomic (:mod:`yolo_ckpt.train.atomic`), the end's
        stage kept (:func:`~yolo_ckpt.train.run_stats.ending`: an interrupted end still writes the run report)."""
        ranks = distributed.cpu_validation() if self.device.type == "cpu" and self.world_size > 1 else contextlib.nullcontext()
        with run_stats.ending(self), validating(self), atomic_saves(self.wdir), ranks:
            super().final_eval()

    def run_report(self, not_measured: tuple = ()) -> RunReport:
        """The :class:`~yolo_ckpt.report.record.RunReport` of this finished run (:func:`yolo_ckpt.train.run_stats.run_report`,
        without what ``not_measured`` names), which ``on_train_end`` writes to ``ckpt_report.json``."""
        return run_stats.run_report(self, not_measured)


@functools.cache
def checkpointed(trainer_cls: type) -> type:
    """``trainer_cls`` (any Ultralytics trainer, a user's own subclass included) with activation checkpointing
    (``recompute=``) and the run report: the class ``Checkpoint<Name>(CheckpointTrainerMixin, trainer_cls)``.

    Cached: the same class comes back for the same trainer. The classes made of Ultralytics' own trainers become
    attributes of ``yolo_ckpt.train.trainer`` (``CheckpointDetectionTrainer``, ``CheckpointDepthTrainer``, ...), so pickle
    and the DDP launcher's cloudpickle store them by reference; cloudpickle stores a user's class by value.

    Examples:
        >>> from ultralytics.models.yolo.detect import DetectionTrainer
        >>> class MyTrainer(DetectionTrainer): ...
        >>> YOLO("yolo11n.yaml").train(trainer=checkpointed(MyTrainer), data="coco8.yaml", recompute="auto", memory_budget="4GB")

    Raises:
        TypeError: if ``trainer_cls`` is not a subclass of Ultralytics' ``BaseTrainer``.
    """
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, BaseTrainer)):
        raise TypeError(f"checkpointed() takes an Ultralytics trainer class (a BaseTrainer subclass), got {trainer_cls!r}")
    if issubclass(trainer_cls, CheckpointTrainerMixin):
        return trainer_cls
    name = f"Checkpoint{trainer_cls.__name__}"
    doc = f"``{trainer_cls.__name__}`` with activation checkpointing (``recompute=``) and a run report."
    cls = type(name, (CheckpointTrainerMixin, trainer_cls), {"__module__": __name__, "__qualname__": name, "__doc__": doc})
    if trainer_cls.__module__.startswith("ultralytics."):  # importable by name, in a DDP worker too
        globals().setdefault(name, cls)
    return cls


CheckpointDetectionTrainer = checkpointed(DetectionTrainer)
CheckpointSegmentationTrainer = checkpointed(SegmentationTrainer)
CheckpointOBBTrainer = checkpointed(OBBTrainer)
CheckpointPoseTrainer = checkpointed(PoseTrainer)
CheckpointClassificationTrainer = checkpointed(ClassificationTrainer)


def trainer_for(task: str, model=None) -> type:
    """The checkpointed trainer of an Ultralytics task, from Ultralytics' own task table: that of ``model`` (a
    ``YOLO``, ``RTDETR``, ... instance, so an RT-DETR model gets ``RTDETRTrainer`` for task ``detect``, as
    ``Model.train`` picks it), else ``YOLO.task_map``.

    Examples:
        >>> from ultralytics import YOLO
        >>> from yolo_ckpt import trainer_for
        >>> trainer_for("detect").__name__
        'CheckpointDetectionTrainer'
        >>> model = YOLO("yolo11n-seg.yaml")
        >>> model.train(trainer=trainer_for(model.task, model), data="coco8-seg.yaml", imgsz=1280, recompute="all")

    Raises:
        ValueError: for a task the table does not have, naming the tasks it has.
    """
    from ultralytics import YOLO

    from ..suggest import did_you_mean

    table = model.task_map if model is not None else YOLO.task_map.fget(None)  # the property reads no instance state
    if task not in table:
        raise ConfigError(f"task={task!r} is not an Ultralytics task{did_you_mean(task, table)}; valid tasks: {', '.join(table)}")
    return checkpointed(table[task]["trainer"])
