"""What yolo-ckpt plans and measures for one training run, on one object: the trainer's ``ckpt_state``
(:class:`RunState`), beside its typed keys (``ckpt_config``) and the policy applied (``policy``).

The mixin (:class:`~yolo_ckpt.train.trainer.CheckpointTrainerMixin`) makes it first thing in ``__init__``; the planning
(:mod:`yolo_ckpt.train.planning`), the run folder's restore (:mod:`yolo_ckpt.train.run_dir`) and the run statistics
(:mod:`yolo_ckpt.train.run_stats`) fill it; the run report reads it. It stays in the process: Ultralytics' checkpoints
are built from chosen attributes (``BaseTrainer.save_model``: the EMA, the optimizer, ``vars(args)``, ...) and the DDP
launcher pickles the trainer's class, args, model and callbacks, never the trainer, so each DDP worker makes its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from ..memory import Plan, PlannedRun, StepProfile
    from .run_dir import RunDirState


@dataclass
class RunState:
    """What one training run plans and measures, in the order it happens.

    Attributes:
        run_dir_before: the run folder as it was before the run and what the run wrote into it
            (:func:`~yolo_ckpt.train.run_dir.run_dir_state`), undone if set-up fails
            (:func:`~yolo_ckpt.train.run_dir.restored_on_failure`); None once the first epoch starts.
        lock: the run folder's lock this run holds until it ends (:func:`~yolo_ckpt.train.run_dir.lock_run_dir`), or None.
        planned: the run the memory model assumes (:func:`~yolo_ckpt.train.planning.plan_run`); None if it never planned.
        plan: recompute=auto's plan, or batch=-1's (:mod:`yolo_ckpt.train.planning`); None without one.
        estimated_peaks: the set-up estimate's peaks in bytes, ``{"none", "all", "policy"}``
            (:func:`~yolo_ckpt.train.planning.estimate_step_peaks`); empty when skipped.
        estimated_steps: the estimate's steps (fake passes) of ``none`` and the ``policy``, for the run's picture.
        estimated_step: what the estimate assumed: ``{"batch", "imgsz", "objects", "device", "amp"}``.
        estimate_skipped: why there is no estimate (``"estimate=False"``, a model it does not cover, or
            ``"the estimate failed: ..."``), or None.
        step_s: seconds of each training step (callbacks around it; CUDA synchronised). t0: the current step's start.
        best_epoch: the epoch (from 1) whose weights ``best.pt`` holds (set where Ultralytics writes it).
        val_s: seconds of each validation: every epoch's and the final one of ``best.pt`` (the trainer's ``validate``
            and ``final_eval``, :func:`~yolo_ckpt.train.run_stats.validating`).
        probe_batch: the CPU's kept full-size training batch, for the end-of-run memory probe.
        batch_at_start: the batch training started with (after batch=-1).
        train_peak, val_peak: the CUDA allocator's peaks, ``{"allocated": bytes, "reserved": bytes}``.
        train_probe: the CPU probe's profile of one training step, at the end of the run (the report's peak).
        batch_index: the current batch's index in its epoch; batches: ``_do_train``'s ``nb``, the train loader's length when the loop
            began (it counts ``ni`` with it, whatever loader a callback puts in place later); last_step: the run's batch index
            (``_do_train``'s ``ni``) of its last optimizer step, -1 before the first; pending_step: a resumed run's ``last_step`` until its
            first optimizer step; resumed: the exact resume state kept for the first resumed epoch; chain_start, chain_batches: the train
            loader's generator state its current index chain started from and the batches drawn from it since; replay: a resumed run's saved
            chain, until its loader makes its first iterator
            (:mod:`yolo_ckpt.train.exact_resume`).
        ending: where the run's end is: ``"final_validation"`` while ``final_eval`` runs, ``"memory_probe"`` until the run
            report is written, ``"written"`` after (:func:`~yolo_ckpt.train.run_stats.report_interrupted_end`); None
            before the end.
        saving: while ``last.pt`` and ``resume_state.pt`` are being written (one epoch's pair): a Ctrl-C or SIGTERM then
            waits for both (:func:`~yolo_ckpt.train.resume.stop_on_interrupt`).
    """

    run_dir_before: RunDirState | None = None
    lock: Path | None = None
    planned: PlannedRun | None = None
    plan: Plan | None = None
    estimated_peaks: dict = field(default_factory=dict)
    estimated_steps: dict = field(default_factory=dict)
    estimated_step: dict | None = None
    estimate_skipped: str | None = None
    step_s: list = field(default_factory=list)
    t0: float = 0.0
    val_s: list = field(default_factory=list)
    best_epoch: int | None = None
    probe_batch: dict | None = None
    batch_at_start: int | None = None
    train_peak: dict = field(default_factory=dict)
    val_peak: dict = field(default_factory=dict)
    train_probe: StepProfile | None = None
    batch_index: int = -1
    batches: int | None = None
    last_step: int = -1
    pending_step: int | None = None
    resumed: dict | None = None
    chain_start: Any = None
    chain_batches: int = 0
    replay: tuple | None = None
    ending: str | None = None
    saving: bool = False

    @property
    def run_spec(self):
        """The :class:`~yolo_ckpt.memory.runspec.RunSpec` the memory model assumed (``planned.spec``), or None."""
        return self.planned.spec if self.planned is not None else None
