"""The memory of a training step, and the one front door to it: the rest of the package (train, cli, bench) and the
studies in ``benchmarks/`` import the names below from ``yolo_ckpt.memory``, never from its modules (an
import-linter contract in ``pyproject.toml``, ``memory-front-door``). The names load on first use (PEP 562
``__getattr__`` from ``lazy_loader.attach``, as :mod:`yolo_ckpt` does): each module imports torch, and ``from yolo_ckpt.memory import
size_text`` loads only the module that defines it.

- planned: :class:`MemoryModel` (``recompute=auto``, the largest batch and imgsz for a budget; it holds a
  :class:`~yolo_ckpt.memory.composed.ComposedEstimate`), :class:`Plan`, :class:`PlanError`, :func:`size_text`
  (:mod:`.memory_model`); the one builder of a run's memory model, :class:`PlannedRun` and :func:`planned_run`, and
  :func:`decide` (``recompute=auto`` and ``batch=-1`` for train, cli and bench), :data:`ESTIMATE_BASE_BATCH`
  (:mod:`.planning`);
- estimated: :func:`estimate_step` (a fake step on a fake copy with the loss formula on top, CUDA AMP emulated on the
  CPU; :mod:`.estimate`), the loss formula :class:`LossModel` (:mod:`.loss_model`) and its calibration,
  :func:`calibrate_loss`, :func:`loss_models` (:mod:`.loss_calibration`), the boxes' sizes that bound it,
  :class:`ObjectSizes` (:mod:`.foreground`);
- measured: the one training-step harness :func:`profile_step`, its :class:`StepProfile` and
  :func:`probe_validation_step` (:mod:`.step`), the task's synthetic batch :func:`training_batch`
  (:mod:`.synthetic_batch`), per-layer FLOPs :func:`layer_flops` and a fake step's FLOPs with a policy applied,
  :func:`step_flops` (:mod:`.layer_accounting`), the attention modules'
  tokens :func:`attention_tokens` (:mod:`.attention_shapes`), the assigner's foreground :func:`measured_foreground`;
- the Ultralytics rules the memory model mirrors, each citing its line (:mod:`.ultralytics_rules`): :data:`TASKS`,
  :func:`model_task`, :func:`device_type`, :func:`amp_enabled`, :func:`autocast_for`, :func:`optimizer_for`,
  :func:`build_optimizer`, :func:`frozen_layers`, :func:`autobatch_fraction`, :func:`label_caches_in_memory`.

Inside the wing: the counters (:mod:`.tracker`), the fake copy (:mod:`.fake_copy`) and its
shape rules (:mod:`.fake_rules`), one torch thread for real tensor work (:mod:`.threads`), CUDA AMP emulated (:mod:`.amp`),
the per-unit composition (:mod:`.composed`), the disk cache (:mod:`.estimate_cache`), the run assumed
(:mod:`.runspec`) and the box layout bound (:mod:`.box_layout`).
"""

from __future__ import annotations

import lazy_loader

# the module of this wing that defines them -> public names
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "memory_model": ["IMGSZ_LIMIT", "MemoryModel", "Plan", "PlanError", "size_text"],
    "planning": ["ESTIMATE_BASE_BATCH", "PlannedRun", "decide", "planned_run"],
    "estimate": ["estimate_step"],
    "loss_model": ["LossModel"],
    "loss_calibration": ["calibrate_loss", "loss_models"],
    "foreground": ["ObjectSizes", "measured_foreground"],
    "step": ["StepProfile", "probe_validation_step", "profile_step"],
    "synthetic_batch": ["training_batch"],
    "layer_accounting": ["layer_flops", "step_flops"],
    "attention_shapes": ["attention_tokens"],
    "ultralytics_rules": [
        "TASKS", "amp_enabled", "autobatch_fraction", "autocast_for", "build_optimizer", "device_type",
        "frozen_layers", "grid_size", "label_caches_in_memory", "model_task", "optimizer_for",
    ],
})

