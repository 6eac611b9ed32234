"""The trainer's planning: ``recompute=auto`` (:func:`plan_recompute`), ``batch=-1`` (:func:`planned_batch`) and what
recompute buys the run (:func:`estimate_step_peaks`), each from the one builder of a run's memory model
(:func:`yolo_ckpt.memory.planning.planned_run`), and the checks planning needs before any write
(:func:`check_planning`). Plain functions of a :class:`~yolo_ckpt.train.trainer.CheckpointTrainerMixin` trainer; they
set the ``plan``, ``planned`` and ``estimate*`` fields of its :class:`~yolo_ckpt.train.state.RunState`
(``trainer.ckpt_state``)."""

from __future__ import annotations

import contextlib
import time

import torch
from ultralytics.engine.trainer import BaseTrainer
from ultralytics.models.rtdetr.train import RTDETRTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer
from ultralytics.models.yolo.world import WorldTrainer
from ultralytics.models.yolo.yoloe import YOLOEPESegTrainer, YOLOEPETrainer, YOLOETrainer
from ultralytics.utils import DEFAULT_CFG, LOGGER
from ultralytics.utils.torch_utils import unwrap_model

from ..checkpointing.policy import is_auto
from ..config import CkptConfig
from ..errors import ConfigError, one_line
from ..memory import ESTIMATE_BASE_BATCH, TASKS, PlanError, autobatch_fraction, decide, device_type, size_text
from ..report.record import one_unit
from .log import PREFIX

# Trainers of a planned task (detect, segment) whose models and losses the estimate does not know: named policies only
NOT_PLANNED = (RTDETRTrainer, WorldTrainer, YOLOETrainer, YOLOEPETrainer, YOLOEPESegTrainer)


def check_planning(trainer_cls: type, task: str, config: CkptConfig, overrides: dict) -> None:
    """Check what planning needs before any write: bytes, not a fraction, for a budget on the CPU; a budget for
    recompute=auto on the CPU; an estimate for the task wherever one plans (batch=-1 on the CPU without a budget
    does not plan: it is stock AutoBatch's batch 16).

    Raises:
        ConfigError: naming the key and what it needs.
    """
    auto = is_auto(config.recompute)
    autobatch = float(overrides.get("batch", DEFAULT_CFG.batch)) < 1
    cpu = device_type(overrides.get("device")) != "cuda" or not torch.cuda.is_available()
    budget = config.memory_budget
    if cpu and budget is not None:
        budget.bytes(None)  # raises for a fraction, which needs a CUDA device
    if auto and cpu and budget is None:
        raise ConfigError(
            "recompute=auto on the CPU needs memory_budget= (bytes with a unit, e.g. memory_budget=8GB): there is no device "
            "memory to plan for"
        )
    what = "recompute=auto" if auto else "batch=-1" if autobatch and not (cpu and budget is None) else None
    if what and (task not in TASKS or issubclass(trainer_cls, NOT_PLANNED)):
        raise ConfigError(
            f"{what} plans memory with the estimate, which exists for YOLO models of the tasks "
            f"{', '.join(TASKS)}; for {trainer_cls.__name__} (task {task}) give a named policy and a batch"
        )


def cuda_available(device: torch.device) -> int:
    """CUDA bytes available to this run as AutoBatch counts them: free memory plus what this process reserved."""
    return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)


def budget_bytes(trainer) -> int:
    """memory_budget= in bytes; on CUDA by default AutoBatch's fraction for batch=
    (:func:`~yolo_ckpt.memory.ultralytics_rules.autobatch_fraction`) of the memory available.

    Raises:
        PlanError: for a budget in bytes above the CUDA memory available, which no plan can honour.
    """
    available = cuda_available(trainer.device) if trainer.device.type == "cuda" else None
    given = trainer.ckpt_config.memory_budget
    if given is None:
        return int(autobatch_fraction(trainer.args.batch) * available)
    budget = given.bytes(available)
    if available is not None and budget > available:
        raise PlanError(
            f"memory_budget={given} ({size_text(budget)}) is more than the {size_text(available)} of CUDA memory available on "
            f"{trainer.device}"
        )
    return budget


def plan_run(trainer, batch: int):
    """The run ``trainer`` plans (:func:`yolo_ckpt.memory.planning.planned_run`): its model, keys, data and device;
    the data counted once per run (RNG untouched). Kept as ``trainer.ckpt_state.planned``; logs what it assumed
    (its ``run_spec``)."""
    from ..memory import planned_run

    state = trainer.ckpt_state
    counts = state.planned.counts if state.planned else None
    state.planned = planned_run(
        trainer.args, unwrap_model(trainer.model), trainer.ckpt_config, trainer.device.type, trainer.data, batch=batch, counts=counts
    )
    LOGGER.info(f"{PREFIX}memory model {state.run_spec.describe()}")
    return state.planned


@contextlib.contextmanager
def estimate_needed(what: str):
    """Inside the block the run needs the memory estimate (``recompute=auto``, ``batch=-1``): where the estimate fails
    (an Ultralytics feature or model it does not know, not the user's input), a :class:`PlanError` in one line,
    naming ``what`` needed it, the failure and what trains without it; raised during set-up, so the run directory is
    put back as it was (:func:`~yolo_ckpt.train.run_dir.restored_on_failure`). Bad input (a ConfigError, PlanError
    included) passes as it is.

    Raises:
        PlanError: as above.
    """
    try:
        yield
    except ConfigError:
        raise
    except Exception as e:
        raise PlanError(
            f"{what} needs the memory estimate, which failed for this run ({type(e).__name__}: {one_line(e)}); "
            "give a named recompute= (e.g. recompute=all) and a batch= to train without it"
        ) from e


def plan_recompute(trainer) -> str:
    """recompute=auto: the cheapest set of layers, head branches and loss region that fits the budget at this
    run's batch and largest imgsz (:meth:`yolo_ckpt.memory.memory_model.MemoryModel.plan`), kept as ``trainer.ckpt_state.plan``. With
    batch=-1 the order is: recompute everything (``all``), then take the largest batch that fits
    (:func:`planned_batch`); both by :func:`yolo_ckpt.memory.planning.decide`.

    Raises:
        PlanError: when nothing fits the budget; where the estimate fails (:func:`estimate_needed`).
    """
    if trainer.args.batch < 1:
        LOGGER.info(f"{PREFIX}recompute=auto with batch=-1: recompute everything (all), then take the largest batch")
        return decide("auto", trainer.args.batch).recompute
    with estimate_needed("recompute=auto"):
        run = plan_run(trainer, trainer.args.batch)
        memory, imgsz = run.memory_model(), run.imgsz
        plan = trainer.ckpt_state.plan = decide("auto", trainer.args.batch, memory, budget_bytes(trainer), imgsz, run.counts.images).plan
    LOGGER.info(
        f"{PREFIX}plan for memory_budget={size_text(plan.budget_bytes)}: recompute={plan.recompute}, "
        f"estimated peak {size_text(plan.estimated_peak_bytes)}"
        + (f" + headroom {size_text(plan.headroom_bytes)}" if plan.headroom_bytes else "")  # none off CUDA
        + f" at batch={plan.batch} imgsz={imgsz}, recompute cost {plan.recompute_cost:.1%} of a step's FLOPs"
    )
    return plan.recompute


def planned_batch(trainer) -> int:
    """batch=-1 (or a fraction) with a budget or on CUDA, the recompute policy already applied to ``trainer.model``:

    - CUDA: Ultralytics' AutoBatch (``BaseTrainer.auto_batch`` -> ``check_train_batch_size``) profiles real steps
      of the patched model, so its pick reflects the recomputation; a byte ``memory_budget=`` reaches it as the
      fraction it takes (budget / the memory it counts as available). The estimate's batch is logged beside it
      as a cross-check; for segmentation, the only task with a loss region, the smaller of the two is taken
      (AutoBatch models the detection loss, never a mask loss).
    - CPU with ``memory_budget=``: the largest batch whose estimate fits, at the largest multi-scale imgsz,
      capped by the dataset's images and AutoBatch's 1024 (:func:`yolo_ckpt.memory.planning.decide`).

    Raises:
        PlanError: on the CPU, when not even batch 1 fits the budget, saying the need; where the estimate fails
            (:func:`estimate_needed`).
    """
    policy, cuda = trainer.policy, trainer.device.type == "cuda"
    with estimate_needed("batch=-1"):
        run = plan_run(trainer, ESTIMATE_BASE_BATCH)
        budget, imgsz, memory, images = budget_bytes(trainer), run.imgsz, run.memory_model(), run.counts.images
        units = memory.units(policy)
        if cuda:
            estimated = memory.largest_batch(units, budget, imgsz, images)
        else:
            estimated = decide(policy, -1, memory, budget, imgsz, images).batch
    batch = estimated
    if cuda:
        batch = autobatch(trainer, budget)
        LOGGER.info(f"{PREFIX}AutoBatch measured batch={batch} ({policy.spec}); the estimate's for {size_text(budget)} is {estimated}")
        if isinstance(trainer, SegmentationTrainer) and estimated < batch:  # AutoBatch never sees a mask loss
            LOGGER.info(f"{PREFIX}batch={max(estimated, 1)}: the estimate counts the mask loss, AutoBatch does not")
            batch = max(estimated, 1)
    LOGGER.info(f"{PREFIX}batch={batch} for memory_budget={size_text(budget)} at imgsz={imgsz} ({policy.spec})")
    state = trainer.ckpt_state
    with estimate_needed("batch=-1"):
        # the batch's own fake pass (the search's, cached), as plan's rows: the composition scaled from batch 2 is not exact
        state.plan = state.plan or memory.as_plan(units, memory.estimate(memory.spec(units), batch, imgsz).peak_bytes, budget, batch, imgsz)
    return batch


def autobatch(trainer, budget: int) -> int:
    """Ultralytics' AutoBatch on the patched model at the fraction ``budget`` is of the memory it counts as
    available (``check_train_batch_size`` reads the fraction from the batch it is given)."""
    counts = trainer.ckpt_state.planned.counts
    requested, trainer.batch_size = trainer.batch_size, min(budget / cuda_available(trainer.device), 0.999)  # AutoBatch takes (0, 1)
    try:
        return BaseTrainer.auto_batch(trainer, counts.planned_objects, dataset_size=counts.images)
    finally:
        trainer.batch_size = requested


def estimate_step_peaks(trainer, task: str) -> None:
    """What recompute buys this run: the memory model's peaks for ``none``, ``all`` and the policy that trains, at
    the batch (no more than the training set's images) and largest imgsz this run trains, for its spec (the planned
    run's memory model reused), into ``trainer.ckpt_state``'s ``estimated_peaks`` (bytes) and ``estimated_step``, and the
    steps of ``none`` and the policy (for the run's picture) into its ``estimated_steps``; each a fake pass at that
    step (:meth:`yolo_ckpt.memory.memory_model.MemoryModel.estimate`, cached: plan's rows are the same passes), not the
    composition, which under ``batch=-1`` is scaled from the base pass's batch 2 and was 1.15-1.23x above them.
    Skipped, with the reason in its ``estimate_skipped``, for ``estimate=False`` and for models the memory model does
    not cover. An estimate that fails is a report, not a gate: one warning line naming the failure, and the run
    trains on without it. A ``memory_budget=`` that chose nothing (a named policy at a given batch) and that the
    estimate is above is said in one warning line."""
    from ultralytics.nn.tasks import BaseModel

    state = trainer.ckpt_state
    if not trainer.ckpt_config.estimate:
        state.estimate_skipped = "estimate=False"
    elif task not in TASKS or isinstance(trainer, NOT_PLANNED) or not isinstance(unwrap_model(trainer.model), BaseModel):
        state.estimate_skipped = (
            f"the memory model does not cover {type(trainer).__name__} with {type(unwrap_model(trainer.model)).__name__}"
        )
    if state.estimate_skipped:
        return
    try:
        _estimate_step_peaks(trainer)
    except Exception as e:  # what recompute buys is a report: its failure never stops the run
        state.estimated_steps, state.estimated_peaks, state.estimated_step = {}, {}, None
        state.estimate_skipped = f"the estimate failed: {type(e).__name__}: {one_line(e)}"
        LOGGER.warning(f"{PREFIX}{state.estimate_skipped}; training goes on without it")


def _estimate_step_peaks(trainer) -> None:
    state = trainer.ckpt_state
    start = time.process_time()
    run = state.planned or plan_run(trainer, trainer.batch_size)
    # the largest step this run makes: a training set smaller than batch= makes every step of its size (issue 31: a
    # 2-image set's measured step stood beside estimates at batch 16)
    loader = getattr(trainer, "train_loader", None)
    batch = min(trainer.batch_size, len(loader.dataset)) if loader is not None else trainer.batch_size
    memory, policy = run.memory_model(), trainer.policy

    def estimate(recompute):  # a fake pass: the composition is close, not exact, and under batch=-1 it is scaled from batch 2
        return memory.estimate(recompute, batch, run.imgsz)

    steps = state.estimated_steps = {"none": estimate("none"), "policy": estimate(policy)}
    peaks = state.estimated_peaks = {
        "none": steps["none"].peak_bytes, "all": estimate("all").peak_bytes, "policy": steps["policy"].peak_bytes
    }
    state.estimated_step = {
        "batch": batch,
        "imgsz": run.imgsz,
        "objects": run.spec.objects,
        "device": run.spec.device,
        "amp": run.spec.amp,
    }
    size = one_unit(max(peaks.values()))
    named = {policy.spec: peaks["policy"], "none": peaks["none"], "all": peaks["all"]}  # none's or all's policy named once
    LOGGER.info(
        f"{PREFIX}estimated at batch {batch}, imgsz {run.imgsz}: " + ", ".join(f"{name} {size(n)}" for name, n in named.items())
        + f" ({time.process_time() - start:.1f} CPU s; estimate=False skips it)"
    )
    if trainer.ckpt_config.memory_budget is not None and state.plan is None:  # a named policy at a given batch: the budget chose nothing
        budget, need = budget_bytes(trainer), memory.headroom.need(peaks["policy"])
        if need > budget:
            LOGGER.warning(
                f"{PREFIX}memory_budget={size_text(budget)} is below this run's estimated need of {size_text(need)} "
                f"(recompute={policy.spec}, batch={batch}): the budget picks recompute=auto's policy and batch=-1's batch, "
                "and this run asked for neither; give recompute=auto or batch=-1 to plan within it"
            )
