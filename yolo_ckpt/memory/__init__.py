"""The memory of a training step, and the one front door to it: the rest of the package (train, cli, bench) and the
studies in ``benchmarks/`` import the names below from ``yolo_ckpt.memory``, never from its modules (an
import-linter contract in ``pyproject.toml``, ``memory-front-door``). The names load on first use (PEP 562
``__getattr__``, as :mod:`yolo_ckpt` does): each module imports torch, and ``from yolo_ckpt.memory import
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

Inside the wing: the counters (:mod:`.tracker`), the fake copy (:mod:`.fake_copy`), CUDA AMP emulated (:mod:`.amp`),
the per-unit composition (:mod:`.composed`), the disk cache (:mod:`.estimate_cache`), the run assumed
(:mod:`.runspec`) and the box layout bound (:mod:`.box_layout`).
"""

from __future__ import annotations

import importlib

# public name -> the module of this wing that defines it
_EXPORTS = {
    "MemoryModel": "memory_model",
    "Plan": "memory_model",
    "PlanError": "memory_model",
    "size_text": "memory_model",
    "ESTIMATE_BASE_BATCH": "planning",
    "PlannedRun": "planning",
    "decide": "planning",
    "planned_run": "planning",
    "estimate_step": "estimate",
    "LossModel": "loss_model",
    "calibrate_loss": "loss_calibration",
    "loss_models": "loss_calibration",
    "ObjectSizes": "foreground",
    "measured_foreground": "foreground",
    "StepProfile": "step",
    "probe_validation_step": "step",
    "profile_step": "step",
    "training_batch": "synthetic_batch",
    "layer_flops": "layer_accounting",
    "step_flops": "layer_accounting",
    "attention_tokens": "attention_shapes",
    "TASKS": "ultralytics_rules",
    "amp_enabled": "ultralytics_rules",
    "autobatch_fraction": "ultralytics_rules",
    "autocast_for": "ultralytics_rules",
    "build_optimizer": "ultralytics_rules",
    "device_type": "ultralytics_rules",
    "frozen_layers": "ultralytics_rules",
    "label_caches_in_memory": "ultralytics_rules",
    "model_task": "ultralytics_rules",
    "optimizer_for": "ultralytics_rules",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import the module that defines the public ``name`` on its first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
