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
final (given, else resumed, else the task's default, else the YAML's).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from ultralytics.cfg import get_cfg, get_save_dir
from ultralytics.engine.trainer import BaseTrainer
from ultralytics.models.rtdetr.train import RTDETRTrainer
from ultralytics.models.yolo.classify import ClassificationTrainer
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.models.yolo.obb import OBBTrainer
from ultralytics.models.yolo.pose import PoseTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer
from ultralytics.models.yolo.world import WorldTrainer
from ultralytics.models.yolo.yoloe import (
    YOLOEPESegTrainer,
    YOLOEPETrainer,
    YOLOETrainer,
)
from ultralytics.utils import (
    DEFAULT_CFG,
    LOGGER,
    RANK,
    YAML,
    IterableSimpleNamespace,
    colorstr,
)
from ultralytics.utils.torch_utils import unwrap_model

from . import distributed, report
from .atomic import atomic_saves, atomic_write_bytes, remove_stale_temporaries
from .checkpointing.engine import apply_checkpointing
from .checkpointing.policy import is_auto, layout_of, resolve
from .config import DEFAULTS, TASK_DEFAULTS, CkptConfig
from .data_check import check_train_labels
from .errors import ConfigError
from .inputs import check_train_inputs
from .memory.plan import PLANNED_TASKS, PlanError, size_text
from .memory.runspec import (
    autobatch_fraction,
    device_type,
    frozen_layers,
)
from .report.layer_plot import layer_plot, write_layer_plot

PREFIX = colorstr("yolo-ckpt: ")
LAYER_PLOT_NAME = "ckpt_layers.png"
# Trainers of a planned task (detect, segment) whose models and losses the estimate does not know: named policies only
NOT_PLANNED = (RTDETRTrainer, WorldTrainer, YOLOETrainer, YOLOEPETrainer, YOLOEPESegTrainer)


def _model_source(overrides: dict):
    """The checkpoint or YAML the trainer will build its model from: the resumed ``last.pt``, else ``model=``."""
    resume = overrides.get("resume")
    if isinstance(resume, (str, Path)) and Path(resume).is_file():
        return resume
    return overrides.get("model")


@dataclass
class RunStats:
    """What a run measures for its report as it trains.

    Attributes:
        step_s: seconds of each training step (callbacks around it; CUDA synchronised). t0: the current step's start.
        probe_batch: the CPU's kept full-size training batch, for the end-of-run memory probe.
        batch_at_start: the batch training started with (after batch=-1).
        train_peak, val_peak: the CUDA allocator's peaks, ``{"allocated": bytes, "reserved": bytes}``.
    """

    step_s: list = field(default_factory=list)
    t0: float = 0.0
    probe_batch: dict | None = None
    batch_at_start: int | None = None
    train_peak: dict = field(default_factory=dict)
    val_peak: dict = field(default_factory=dict)


def _on_train_batch_start(trainer) -> None:
    trainer.ckpt_stats.t0 = time.perf_counter()


def _on_train_batch_end(trainer) -> None:
    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)
    trainer.ckpt_stats.step_s.append(time.perf_counter() - trainer.ckpt_stats.t0)


def _on_train_end(trainer) -> None:
    """Write the run report and log where it is and its headline; with ``plots=True`` and a CPU probe, the per-layer
    picture of the probed step (``ckpt_layers.png``, :mod:`yolo_ckpt.report.layer_plot`)."""
    record = trainer.run_report()
    path = record.write(trainer.save_dir)
    LOGGER.info(f"{PREFIX}run report {path}\n{PREFIX}{record.headline()}")
    if trainer.args.plots and trainer.train_probe is not None:
        title = f"{Path(str(trainer.args.model)).stem}, recompute={record.recompute}: one training step on the CPU (the run report's probe)"
        write_layer_plot(layer_plot(trainer.train_probe, trainer.policy, title), trainer.save_dir / LAYER_PLOT_NAME)


def _on_pretrain_routine_end(trainer) -> None:
    trainer.ckpt_stats.batch_at_start = trainer.batch_size  # after batch=-1; an OOM halving may lower it later
    if RANK in {-1, 0}:
        trainer.estimate_step_peaks()


def _on_train_start(trainer) -> None:
    trainer._run_dir_before = None  # the first epoch starts: a failure from here on keeps the run folder as it is


CALLBACKS = {
    "on_pretrain_routine_end": _on_pretrain_routine_end,
    "on_train_start": _on_train_start,
    "on_train_batch_start": _on_train_batch_start,
    "on_train_batch_end": _on_train_batch_end,
    "on_train_end": _on_train_end,
}


class CheckpointTrainerMixin:
    """Adds activation checkpointing and the run report to an Ultralytics task trainer (place it first)."""

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        """Take yolo-ckpt's keys out of ``overrides``/``cfg``, validate them, then build the Ultralytics trainer.

        Raises:
            ConfigError: for an invalid yolo-ckpt key or input (:meth:`check_keys`) or training set
                (:func:`~yolo_ckpt.data_check.check_train_labels`), before any file or folder is written. Whatever
                Ultralytics' trainer raises while it is built (a missing ``data=``: RuntimeError), after the run
                directory is put back as it was (:func:`_restore_run_dir`).
        """
        config, given, overrides = self.check_keys(overrides)
        if RANK in {-1, 0}:
            check_train_labels(type(self), task_of(type(self)), get_cfg(cfg, overrides))
        self._run_dir_before = _run_dir_state(cfg, overrides)
        with self._run_dir_restored_on_failure():  # e.g. a data= that does not exist: Ultralytics wrote args.yaml, removed results.csv
            super().__init__(cfg, overrides, _callbacks)
        if distributed.torchrun_world_size() > 1:  # a torchrun worker: the whole job's ranks, on every node
            self.world_size = distributed.torchrun_world_size()
        # given > restored by resume (train_args) > this task's default > default
        for k, default in {**DEFAULTS, **_task_defaults(type(self))}.items():
            setattr(self.args, k, given.get(k, getattr(self.args, k, default)))
        # typed (the raw values stay on args for args.yaml); a resumed run's own keys are read back from last.pt
        self.ckpt_config = CkptConfig.from_args(vars(self.args)) if self.args.resume else config
        if RANK in {-1, 0}:
            YAML.save(self.save_dir / "args.yaml", vars(self.args))  # again, now with yolo-ckpt's keys
            remove_stale_temporaries(self.wdir)  # of this run's saves a kill interrupted
        self.policy = self.plan = self.run_spec = self._planned = None
        self.ckpt_stats = RunStats()
        self.estimated_peaks, self.estimated_step, self.estimate_skipped = {}, None, None  # estimate_step_peaks()
        self.train_probe = None  # the CPU probe's StepProfile of one training step, at the end of the run
        for event, callback in CALLBACKS.items():  # the DDP worker gets them back in _callbacks already
            if callback not in self.callbacks[event]:
                self.add_callback(event, callback)

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
            ConfigError: for an invalid ``recompute=``, ``recompute_mode=``, ``loss_chunk=``, ``assign_chunk=``, ``memory_budget=`` or
                ``memory_headroom=``, a ``recompute=`` the model does not have (:func:`yolo_ckpt.checkpointing.policy.resolve`), a
                planning request this task or device cannot honour, or an RT-DETR model given to a trainer other
                than RTDETRTrainer's, or a bad ``imgsz=``, ``device=``, ``project=`` or ``model=``
                (:func:`yolo_ckpt.inputs.check_train_inputs`); before anything is written.
        """
        overrides = dict(overrides or {})
        check_train_inputs(overrides)
        given = {k: overrides.pop(k) for k in DEFAULTS if k in overrides}
        config = CkptConfig.from_args(given, task_of(cls) if _task_defaults(cls) else None)  # RT-DETR, World, YOLOE: no loss region
        cls._check_planning(config, overrides)
        source = _model_source(overrides)
        read = isinstance(source, dict) or Path(str(source)).suffix.lower() in {".yaml", ".yml"}  # a YAML: cheap to read
        layout = layout_of(source) if source is not None and read else None
        if layout is not None and layout.types[-1] == "RTDETRDecoder" and not issubclass(cls, RTDETRTrainer):
            # stock would fail at the first loss: v8DetectionLoss reads the head's stride, which RTDETRDecoder has not
            raise ConfigError(
                f"model={source if isinstance(source, (str, Path)) else 'the model'} is an RT-DETR model (RTDETRDecoder head), which {cls.__name__} "
                "cannot train; use trainer_for('detect', model) with the RTDETR model (the checkpointed RTDETRTrainer)"
            )
        if layout is not None and "recompute" in given and not is_auto(config.recompute):  # the model's own errors, before any write
            resolve(config.recompute, layout)
        return config, given, overrides

    @classmethod
    def _check_planning(cls, config: CkptConfig, overrides: dict) -> None:
        """Check what planning needs before any write: bytes, not a fraction, for a budget on the CPU; a budget for
        recompute=auto on the CPU; an estimate for the task wherever one plans (batch=-1 on the CPU without a budget
        does not plan: it is stock AutoBatch's batch 16)."""
        auto = is_auto(config.recompute)
        autobatch = float(overrides.get("batch", DEFAULT_CFG.batch)) < 1
        cpu = device_type(overrides.get("device")) != "cuda" or not torch.cuda.is_available()
        budget = config.memory_budget
        if cpu and budget is not None:
            budget.bytes(None)  # raises for a fraction, which needs a CUDA device
        if auto and cpu and budget is None:
            raise ConfigError("recompute=auto on the CPU needs memory_budget= (bytes with a unit, e.g. memory_budget=8GB): there is no device memory to plan for")
        task = task_of(cls)
        what = "recompute=auto" if auto else "batch=-1" if autobatch and not (cpu and budget is None) else None
        if what and (task not in PLANNED_TASKS or issubclass(cls, NOT_PLANNED)):
            raise ConfigError(
                f"{what} plans memory with the estimate, which exists for YOLO models of the tasks "
                f"{', '.join(PLANNED_TASKS)}; for {cls.__name__} (task {task}) give a named policy and a batch"
            )

    def _budget(self) -> int:
        """memory_budget= in bytes; on CUDA by default AutoBatch's fraction for batch= (:func:`~yolo_ckpt.memory.runspec.autobatch_fraction`)
        of the memory available.

        Raises:
            ValueError: for a budget in bytes above the CUDA memory available, which no plan can honour.
        """
        available = self._cuda_available() if self.device.type == "cuda" else None
        if self.ckpt_config.memory_budget is None:
            return int(autobatch_fraction(self.args.batch) * available)
        budget = self.ckpt_config.memory_budget.bytes(available)
        if available is not None and budget > available:
            raise PlanError(f"memory_budget={self.ckpt_config.memory_budget} ({size_text(budget)}) is more than the {size_text(available)} of CUDA memory available on {self.device}")
        return budget

    def _cuda_available(self) -> int:
        """CUDA bytes available to this run as AutoBatch counts them: free memory plus what this process reserved."""
        return torch.cuda.mem_get_info(self.device)[0] + torch.cuda.memory_reserved(self.device)

    def _planned_run(self, batch: int):
        """The run this trainer plans (:func:`yolo_ckpt.memory.planned_run.planned_run`): its model, keys, data and device;
        the data counted once per run (RNG untouched). Logs what it assumed (``self.run_spec``)."""
        from .memory.planned_run import planned_run

        counts = self._planned.counts if self._planned else None
        self._planned = planned_run(self.args, unwrap_model(self.model), self.ckpt_config, self.device.type, self.data, batch=batch, counts=counts)
        self.run_spec = self._planned.spec
        LOGGER.info(f"{PREFIX}memory model {self.run_spec.describe()}")
        return self._planned

    def _plan_recompute(self) -> str:
        """recompute=auto: the cheapest set of layers, head branches and loss region that fits the budget at this
        run's batch and largest imgsz (:meth:`yolo_ckpt.memory.plan.MemoryModel.plan`). With batch=-1 the order is:
        recompute everything (``all``), then take the largest batch that fits (:meth:`auto_batch`)."""
        if self.args.batch < 1:
            LOGGER.info(f"{PREFIX}recompute=auto with batch=-1: recompute everything (all), then take the largest batch")
            return "all"
        run = self._planned_run(self.args.batch)
        memory, imgsz = run.memory_model(), run.imgsz
        self.plan = memory.plan(self._budget(), self.args.batch, imgsz)
        LOGGER.info(
            f"{PREFIX}plan for memory_budget={size_text(self.plan.budget_bytes)}: recompute={self.plan.recompute}, "
            f"estimated peak {size_text(self.plan.estimated_peak_bytes)} + headroom {size_text(self.plan.headroom_bytes)} "
            f"at batch={self.plan.batch} imgsz={imgsz}, recompute cost {self.plan.recompute_cost:.1%} of a step's FLOPs"
        )
        return self.plan.recompute

    def auto_batch(self):
        """batch=-1 (or a fraction), with the recompute policy already applied to ``self.model``.

        - CUDA: Ultralytics' AutoBatch (``BaseTrainer.auto_batch`` -> ``check_train_batch_size``) profiles real steps
          of the patched model, so its pick reflects the recomputation; a byte ``memory_budget=`` reaches it as the
          fraction it takes (budget / the memory it counts as available). The estimate's batch is logged beside it
          as a cross-check; for segmentation, the only task with a loss region, the smaller of the two is taken
          (AutoBatch models the detection loss, never a mask loss).
        - CPU without ``memory_budget=``: stock (AutoBatch's default batch 16, with its warning, no dataset cap).
        - CPU with ``memory_budget=``: the largest batch whose estimate fits, at the largest multi-scale imgsz,
          capped by the dataset's images and AutoBatch's 1024.

        Raises:
            ValueError: on the CPU, when not even batch 1 fits the budget, saying the need.
        """
        if self.device.type != "cuda" and self.ckpt_config.memory_budget is None:
            LOGGER.warning(f"{PREFIX}batch=-1 on the CPU without memory_budget=: AutoBatch's default batch 16, as stock; memory_budget= plans the largest batch that fits")
            return super().auto_batch()
        run = self._planned_run(2)
        budget, imgsz, memory, images = self._budget(), run.imgsz, run.memory_model(), run.counts.images
        units = memory.units(self.policy)
        estimated = min(memory.largest_batch(units, budget, imgsz), images)
        if self.device.type == "cuda":
            batch = self._autobatch(budget)
            LOGGER.info(f"{PREFIX}AutoBatch measured batch={batch}; the estimate's batch for {size_text(budget)} is {estimated}")
            if isinstance(self, SegmentationTrainer) and estimated < batch:  # AutoBatch never sees a mask loss
                LOGGER.info(f"{PREFIX}batch={max(estimated, 1)}: the estimate counts the mask loss, AutoBatch does not")
                batch = max(estimated, 1)
        elif estimated < 1:
            need = memory.headroom.need(memory.peak(units, 1, imgsz))
            raise PlanError(f"memory_budget={size_text(budget)} is below batch=1's estimated need of {size_text(need)} at imgsz={imgsz} with {self.policy}")
        else:
            batch = estimated
        LOGGER.info(f"{PREFIX}batch={batch} for memory_budget={size_text(budget)} at imgsz={imgsz} ({self.policy.spec})")
        self.plan = self.plan or memory.as_plan(units, memory.peak(units, batch, imgsz), budget, batch, imgsz)
        return batch

    def estimate_step_peaks(self) -> None:
        """What recompute buys this run: the memory model's peaks for ``none``, ``all`` and the policy that trains, at
        the batch and largest imgsz this run trains, for its spec (:func:`yolo_ckpt.memory.planned_run.planned_run`, the
        planned run's memory model reused), into ``estimated_peaks`` (bytes) and ``estimated_step``; composed from
        one fake pass (:meth:`yolo_ckpt.memory.plan.MemoryModel.peak`). Skipped, with the reason in
        ``estimate_skipped``, for ``estimate=False`` and for models the memory model does not cover."""
        from ultralytics.nn.tasks import BaseModel

        if not self.ckpt_config.estimate:
            self.estimate_skipped = "estimate=False"
        elif task_of(type(self)) not in PLANNED_TASKS or isinstance(self, NOT_PLANNED) or not isinstance(unwrap_model(self.model), BaseModel):
            self.estimate_skipped = f"the memory model does not cover {type(self).__name__} with {type(unwrap_model(self.model)).__name__}"
        if self.estimate_skipped:
            return
        start = time.process_time()
        run = self._planned or self._planned_run(self.batch_size)
        memory, batch = run.memory_model(), self.batch_size
        self.estimated_peaks = {name: memory.peak(memory.units(units), batch, run.imgsz) for name, units in (("none", "none"), ("all", "all"), ("policy", self.policy))}
        self.estimated_step = {"batch": batch, "imgsz": run.imgsz, "objects": run.spec.objects, "device": run.spec.device, "amp": run.spec.amp}
        LOGGER.info(
            f"{PREFIX}estimated at batch {batch}, imgsz {run.imgsz}: {self.policy.spec} {size_text(self.estimated_peaks['policy'])}, "
            f"none {size_text(self.estimated_peaks['none'])}, all {size_text(self.estimated_peaks['all'])} "
            f"({time.process_time() - start:.1f} CPU s; estimate=False skips it)"
        )

    def _autobatch(self, budget: int) -> int:
        """Ultralytics' AutoBatch on the patched model at the fraction ``budget`` is of the memory it counts as
        available (``check_train_batch_size`` reads the fraction from the batch it is given)."""
        counts = self._planned.counts
        requested, self.batch_size = self.batch_size, min(budget / self._cuda_available(), 0.999)  # AutoBatch takes (0, 1)
        try:
            return BaseTrainer.auto_batch(self, counts.planned_objects, dataset_size=counts.images)
        finally:
            self.batch_size = requested

    def setup_model(self):
        """Build or load the model as Ultralytics does, then apply the recompute policy and log it."""
        ckpt = super().setup_model()
        config = self.ckpt_config
        recompute = self._plan_recompute() if is_auto(config.recompute) else config.recompute
        self.policy = apply_checkpointing(
            self.model,
            recompute,
            frozen=frozen_layers(self.args.freeze),
            mode=config.recompute_mode,
            loss_chunk=config.loss_chunk,
            assign_chunk=config.assign_chunk,
        )
        if RANK in {-1, 0}:
            LOGGER.info(f"{PREFIX}activation checkpointing {self.policy}")
            if not (self.policy.indices or self.policy.regions()) and self.policy.spec != "none":
                LOGGER.warning(f"{PREFIX}recompute={self.policy.spec} selects no layer with trainable parameters")
        return ckpt

    def preprocess_batch(self, batch):
        """Ultralytics' preprocessing; on the CPU the first full-size batch (the first of the most images, when the
        dataset is smaller than the batch) is kept for the end-of-run memory probe."""
        batch = super().preprocess_batch(batch)
        kept = self.ckpt_stats.probe_batch
        if self.device.type == "cpu" and (kept is None or len(kept["img"]) < min(len(batch["img"]), self.batch_size)):
            self.ckpt_stats.probe_batch = dict(batch)
        return batch

    def get_model(self, *args, **kwargs):
        """Ultralytics' ``get_model`` (``Model.train`` calls it between building the trainer and training), the run
        directory put back as it was if it fails (:meth:`_run_dir_restored_on_failure`)."""
        with self._run_dir_restored_on_failure():
            return super().get_model(*args, **kwargs)

    def train(self):
        """Ultralytics' training. Whatever fails before the first epoch starts (Ultralytics' set-up, the dataset,
        planning: :class:`~yolo_ckpt.memory.plan.PlanError`) leaves the run directory as it was
        (:meth:`_run_dir_restored_on_failure`); then the error is raised."""
        with self._run_dir_restored_on_failure():
            return super().train()

    @contextlib.contextmanager
    def _run_dir_restored_on_failure(self):
        """Put the run directory back as it was before this run (:func:`_restore_run_dir`: removed if this run made
        it, else its previous ``args.yaml`` and ``results.csv``) when the block raises, anything, before the first
        epoch starts (``on_train_start`` clears the saved state: from then on the folder holds this run's results).
        Not for a resumed run (its folder is the resumed one) nor a DDP launcher, whose workers train."""
        try:
            yield
        except BaseException:
            before = getattr(self, "_run_dir_before", None)
            if RANK in {-1, 0} and before and not getattr(self, "ddp", False) and before[0] == getattr(self, "save_dir", before[0]):
                _restore_run_dir(*before)
            raise

    def _setup_ddp(self):
        """Ultralytics' process-group set-up on GPUs; on the CPU a gloo group (:mod:`yolo_ckpt.distributed`)."""
        if self.device.type != "cpu":
            return super()._setup_ddp()
        distributed.init_cpu_process_group(self.world_size)

    def _setup_train(self):
        """Ultralytics' set-up; on the CPU under torchrun its DDP wrap builds a CPU DDP (:func:`~yolo_ckpt.distributed.cpu_ddp`)."""
        with distributed.cpu_ddp() if self.device.type == "cpu" and self.world_size > 1 else contextlib.nullcontext():
            return super()._setup_train()

    def save_model(self):
        """Ultralytics' ``save_model``, with ``last.pt``/``best.pt``/``epochN.pt`` written atomically: a kill during
        the write leaves the previous complete checkpoint (:mod:`yolo_ckpt.atomic`)."""
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
        """Ultralytics' validation, with CUDA peak memory kept apart from training's."""
        with self._cuda_peak("val"):
            return super().validate()

    def final_eval(self):
        """Ultralytics' final validation of ``best.pt``, with its CUDA peak counted as validation, and its
        ``strip_optimizer`` rewrites of ``last.pt`` and ``best.pt`` atomic (:mod:`yolo_ckpt.atomic`)."""
        cpu_ranks = self.device.type == "cpu" and self.world_size > 1
        with self._cuda_peak("val"), atomic_saves(self.wdir), distributed.cpu_validation() if cpu_ranks else contextlib.nullcontext():
            super().final_eval()

    def memory_probes(self):
        """CPU: one training step (forward, loss, backward and the step of the run's optimizer, its state included:
        what the plan estimates) on the kept full-size batch, measured in live tensors, and the peak live-tensor
        bytes of one validation batch of the final model.

        Returns:
            ``(train StepProfile, val_bytes)``; the validation batch is the validation loader's batch size. With
            ``distill_model=`` the training step is not probed (``None``): the harness measures one model's step,
            and a distillation step runs the teacher too.
        """
        from ultralytics.nn.tasks import BaseModel

        from .memory.measure import optimizer_for, probe_validation_step, profile_step

        batch = self.ckpt_stats.probe_batch
        model = unwrap_model(self.model)
        if not isinstance(model, BaseModel):  # DistillationModel (student and teacher)
            return None, probe_validation_step(self.ema.ema, batch["img"])
        val_batch = self.test_loader.batch_size or len(batch["img"])
        images = batch["img"].repeat((val_batch + len(batch["img"]) - 1) // len(batch["img"]), 1, 1, 1)[:val_batch]
        config = self.ckpt_config
        step = profile_step(
            model, batch, self.policy.spec, self.policy.mode, optimizer_for(self.args.optimizer),
            loss_chunk=config.loss_chunk, assign_chunk=config.assign_chunk,
        )
        return step, probe_validation_step(self.ema.ema, images)

    @contextlib.contextmanager
    def _cuda_peak(self, section: str):
        """Count the CUDA allocator's peak inside the block as ``section`` ("val") and the peak before it as
        "train" (:class:`RunStats`); nothing off CUDA."""
        if self.device.type != "cuda":
            yield
            return
        self._bank_cuda_peak("train")
        try:
            yield
        finally:
            self._bank_cuda_peak(section)

    def _bank_cuda_peak(self, section: str) -> None:
        peaks = getattr(self.ckpt_stats, f"{section}_peak")
        peaks["allocated"] = max(peaks.get("allocated", 0), torch.cuda.max_memory_allocated(self.device))
        peaks["reserved"] = max(peaks.get("reserved", 0), torch.cuda.max_memory_reserved(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)

    def run_report(self) -> report.RunReport:
        """The :class:`~yolo_ckpt.report.record.RunReport` of this finished run: its policy and settings, the CUDA
        allocator's peaks (CPU: :meth:`memory_probes` on the kept batch, whose step profile is kept as
        ``self.train_probe`` for the picture), the median step time after :data:`~yolo_ckpt.report.record.WARMUP_STEPS`,
        the plan and the final metrics."""
        import statistics

        import ultralytics

        from . import __version__

        args, stats, policy, plan = self.args, self.ckpt_stats, self.policy, self.plan
        steps = stats.step_s[report.WARMUP_STEPS :]
        if self.device.type == "cuda":
            self._bank_cuda_peak("train")
            source, train, val = "cuda_allocator", stats.train_peak, stats.val_peak
        else:
            self.train_probe, v = self.memory_probes() if stats.probe_batch is not None else (None, None)
            t = self.train_probe.peak_bytes if self.train_probe else None
            source, train, val = "cpu_probe_live_tensors", {"allocated": t}, {"allocated": v}
        return report.RunReport(
            versions={"yolo_ckpt": __version__, "ultralytics": ultralytics.__version__, "torch": torch.__version__},
            task=args.task,
            model=str(args.model),
            data=str(args.data),
            recompute=policy.spec if policy else None,
            recompute_mode=self.ckpt_config.recompute_mode,
            recomputed_layers=policy.layers() if policy else [],
            recomputed_regions=policy.regions() if policy else [],
            device=str(self.device),
            imgsz=args.imgsz,
            batch=self.batch_size,  # after Ultralytics' halvings on an out-of-memory error in the first epoch
            batch_at_start=stats.batch_at_start,
            amp=bool(self.amp),
            epochs=self.epoch + 1,
            memory_source=source,
            **report.probe_counts(stats.probe_batch),
            train_peak_allocated_bytes=train.get("allocated"),
            train_peak_reserved_bytes=train.get("reserved"),
            val_peak_allocated_bytes=val.get("allocated"),
            val_peak_reserved_bytes=val.get("reserved"),
            train_step_time_median_s=statistics.median(steps) if steps else None,
            train_steps_timed=len(steps),
            estimated_none_peak_bytes=self.estimated_peaks.get("none"),
            estimated_all_peak_bytes=self.estimated_peaks.get("all"),
            estimated_policy_peak_bytes=self.estimated_peaks.get("policy"),
            estimated_step=self.estimated_step,
            estimate_skipped=self.estimate_skipped,
            plan=None if plan is None else report.PlanRecord.of(plan, self.run_spec.to_dict() if self.run_spec else None),
            metrics=report.task_metrics(self.metrics),
            ultralytics_metrics={k: float(v) for k, v in (self.metrics or {}).items()},
        )


@functools.cache
def checkpointed(trainer_cls: type) -> type:
    """``trainer_cls`` (any Ultralytics trainer, a user's own subclass included) with activation checkpointing
    (``recompute=``) and the run report: the class ``Checkpoint<Name>(CheckpointTrainerMixin, trainer_cls)``.

    Cached: the same class comes back for the same trainer. The classes made of Ultralytics' own trainers become
    attributes of ``yolo_ckpt.trainer`` (``CheckpointDetectionTrainer``, ``CheckpointDepthTrainer``, ...), so pickle
    and the DDP launcher's cloudpickle store them by reference; cloudpickle stores a user's class by value.

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


RUN_DIR_FILES = ("args.yaml", "results.csv")  # what BaseTrainer.__init__ rewrites (args.yaml) or unlinks (results.csv)


def _run_dir_state(cfg, overrides: dict):
    """``(run dir, whether it exists, {name: (bytes, mode)} of its files in RUN_DIR_FILES)`` as ``BaseTrainer.__init__`` will
    pick the run dir (Ultralytics' ``get_cfg`` and ``get_save_dir``); None for a resumed run, whose folder is the
    resumed one."""
    args = get_cfg(cfg, overrides)
    if args.resume:
        return None
    run_dir = get_save_dir(args)
    files = [run_dir / n for n in RUN_DIR_FILES if (run_dir / n).is_file()]
    return run_dir, run_dir.exists(), {p.name: (p.read_bytes(), p.stat().st_mode & 0o7777) for p in files}


def _restore_run_dir(run_dir: Path, existed: bool, files: dict[str, tuple[bytes, int]]) -> None:
    """Put a run directory back as :func:`_run_dir_state` found it: remove it if it did not exist, else restore its
    ``args.yaml`` and ``results.csv`` (the run rewrote or removed them) and remove the ``weights`` folder the run made
    if it is empty."""
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name, (data, mode) in files.items():
        atomic_write_bytes(run_dir / name, data)
        (run_dir / name).chmod(mode)  # results.csv was removed: a new file would get the umask's mode
    with contextlib.suppress(OSError):  # not empty, or not there: leave it
        (run_dir / "weights").rmdir()


def _task_defaults(trainer_cls: type) -> dict:
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


def trainer_for(task: str, model=None) -> type:
    """The checkpointed trainer of an Ultralytics task, from Ultralytics' own task table: that of ``model`` (a
    ``YOLO``, ``RTDETR``, ... instance, so an RT-DETR model gets ``RTDETRTrainer`` for task ``detect``, as
    ``Model.train`` picks it), else ``YOLO.task_map``.

    Raises:
        ValueError: for a task the table does not have, naming the tasks it has.
    """
    from ultralytics import YOLO

    from .suggest import did_you_mean

    table = model.task_map if model is not None else YOLO.task_map.fget(None)  # the property reads no instance state
    if task not in table:
        raise ConfigError(f"task={task!r} is not an Ultralytics task{did_you_mean(task, table)}; valid tasks: {', '.join(table)}")
    return checkpointed(table[task]["trainer"])
