"""Foreground anchors: what the task-aligned assigner gives (measured), and the bound the loss formula takes.

A segmentation loss's memory grows with its foreground anchors (the anchors the assigner makes positive:
:class:`yolo_ckpt.memory.estimate.LossModel`'s ``Fb`` and ``F1`` terms). :func:`measured_foreground` counts them on a
real batch, per assigner and image (the ``fg_mask`` of Ultralytics' ``TaskAlignedAssigner.forward``,
``ultralytics/utils/tal.py``).
"""

from __future__ import annotations

import copy

import torch


def measured_foreground(model, batch: dict) -> torch.Tensor:
    """The foreground anchors (``fg_mask.sum``) each task-aligned assigner of ``model``'s loss gives each image of
    ``batch``, on the predictions of a copy of ``model`` in training mode: an int64 tensor (assigners, images)."""
    from ..checkpointing.assigner import assigners

    probe = copy.deepcopy(model).train()  # training mode updates BatchNorm statistics: not the caller's
    probe.criterion = probe.init_criterion()
    counts = []
    hooks = [a.register_forward_hook(lambda m, args, out: counts.append(out[3].sum(1))) for a in assigners(probe.criterion)]
    try:
        with torch.no_grad():
            probe.loss(batch, probe(batch["img"]))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(counts) if counts else torch.zeros(0, len(batch["img"]), dtype=torch.int64)

