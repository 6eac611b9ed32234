"""Estimate the peak memory of a training step without computing it: fake tensors plus a calibrated loss formula.

The model's forward, backward and optimizer step run on fake tensors (``torch._subclasses.FakeTensorMode``: shapes,
dtypes and storages, no data), with the recompute policy applied, and :class:`~yolo_ckpt.memory.LiveTensorTracker`
counts the live storages as on the CPU. Fake tensors cannot run the loss: its task-aligned assigner has
data-dependent ops (``nonzero``, ``topk`` over the targets). Its memory is a formula in (batch B, anchors A,
objects per image M), ``c0 + c1*B*A + c2*B*A*M + c3*B*M`` bytes, fitted by least squares to CPU measurements of the
real loss at small sizes (:func:`calibrate_loss`); the fake pass backpropagates a stand-in loss with dense
gradients of the same shapes.

AMP: the fake pass runs under CPU bf16 autocast, whose 2-byte activations match fp16's; the GPU's fp16 autocast
keeps some ops in fp32 that CPU bf16 autocast casts (and vice versa), so AMP estimates are approximate.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map

from .engine import apply_checkpointing, recompute_mode_of
from .memory import LayerRow, LiveTensorTracker, StepProfile, _LayerAccounting, _run_step, anchors, build_optimizer
from .memory import detect_batch, layer_flops

# (batch, imgsz, objects per image) at which the real loss is measured to fit its formula: small, so fast.
CALIBRATION_POINTS = ((1, 128, 8), (2, 192, 40), (2, 256, 16), (1, 320, 20), (2, 320, 4), (1, 256, 32))


def _features(batch: int, n_anchors: int, objects: int) -> np.ndarray:
    return np.array([1.0, batch * n_anchors, batch * n_anchors * objects, batch * objects])


@dataclass(frozen=True)
class LossModel:
    """Bytes of the loss/assigner's peak above what was alive before it, linear in (1, B*A, B*A*M, B*M).

    Attributes:
        coef: the four coefficients, in bytes.
    """

    coef: tuple[float, ...]

    def __call__(self, batch: int, n_anchors: int, objects: int) -> int:
        """The loss's peak bytes for this batch, anchor count and objects per image."""
        return max(0, int(_features(batch, n_anchors, objects) @ np.array(self.coef)))


_LOSS_MODELS: dict[str, LossModel] = {}  # per model YAML and class count: the loss depends on nothing else


def _calibrate(model) -> LossModel:
    rows, peaks = [], []
    fake_mode = FakeTensorMode()
    with FakeCopyMode(fake_mode):
        fake = copy.deepcopy(model).train()
    apply_checkpointing(fake, "none")
    g = torch.Generator().manual_seed(0)
    for batch, imgsz, objects in CALIBRATION_POINTS:
        with fake_mode, torch.no_grad():
            shapes = tree_map(lambda t: t.shape, fake(torch.empty(batch, 3, imgsz, imgsz)))
        # Random predictions of the model's shapes: the loss's memory depends on shapes and targets, not on the
        # values, so no real forward pass is needed, whatever the model's size.
        preds = tree_map(lambda shape: torch.rand(shape, generator=g).requires_grad_(), shapes, is_leaf=_is_shape)
        data = detect_batch(batch, imgsz, objects)
        with LiveTensorTracker() as tracker:
            tracker.track(preds, data)  # views of them are not new memory
            before = tracker.start_phase()
            loss = model.loss(data, preds)[0].sum()
            peaks.append(tracker.phase_peak_bytes - before)
        del loss, preds
        rows.append(_features(batch, anchors(imgsz, model.stride.tolist()), objects))
    return LossModel(tuple(float(c) for c in np.linalg.lstsq(np.array(rows), np.array(peaks, float), rcond=None)[0]))


def _is_shape(x) -> bool:
    return isinstance(x, torch.Size)


def calibrate_loss(model) -> LossModel:
    """Fit the loss formula of a detection ``model`` (its ``nc``, ``reg_max`` and strides) to CPU measurements of
    its real loss at :data:`CALIBRATION_POINTS`; cached per model YAML and class count."""
    key = repr((model.yaml, getattr(model, "nc", None)))
    if key not in _LOSS_MODELS:
        _LOSS_MODELS[key] = _calibrate(model)
    return _LOSS_MODELS[key]


def estimate_step(
    model,
    imgsz: int,
    batch: int,
    objects: int = 20,
    recompute="none",
    mode: str = "full",
    optimizer: str = "AdamW",
    amp: bool = False,
    loss_model: LossModel | None = None,
    flops: bool = True,
) -> StepProfile:
    """Estimate one training step's peak memory (bytes) for a detection ``model`` without computing anything.

    Args:
        model: an Ultralytics detection ``BaseModel`` (real parameters; it is copied onto fake tensors).
        imgsz: square image side in pixels; batch: images per step; objects: targets per image (the loss grows
            with it: take the dataset's maximum, as AutoBatch does).
        recompute, mode: the policy and ``recompute_mode`` to estimate.
        optimizer: whose state to count (:func:`yolo_ckpt.memory.build_optimizer`).
        amp: estimate with 2-byte activations (see the module docstring).
        loss_model: the loss formula; :func:`calibrate_loss` of ``model`` when None.
        flops: count per-layer forward FLOPs (a second fake forward pass).

    Returns:
        A :class:`~yolo_ckpt.memory.StepProfile` with ``source="fake_estimate"``.
    """
    loss_model = loss_model or calibrate_loss(model)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    with FakeCopyMode(fake_mode):
        fake = copy.deepcopy(model).train()
    policy = apply_checkpointing(fake, recompute, mode=mode)
    autocast = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16, enabled=amp)
    with fake_mode:
        images = torch.empty(batch, 3, imgsz, imgsz)
        per_layer_flops = layer_flops(fake, images) if flops else [0] * len(fake.model)
        opt = build_optimizer(fake, optimizer)
        for p in opt.param_groups[0]["params"]:  # the optimizer state every step after the first carries
            p.grad = torch.empty_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        accounting = _LayerAccounting(fake)
        with LiveTensorTracker() as tracker:
            state = [t for s in opt.state.values() for t in s.values()]
            tracker.track(list(fake.parameters()), list(fake.buffers()), state, images)
            static = tracker.live_bytes

            def stand_in_loss(preds):  # dense gradients of the predictions' shapes, as the real loss gives
                fwd_end[0] = tracker.live_bytes
                return sum((t.float() * t.float()).sum() for t in tree_leaves(preds) if isinstance(t, torch.Tensor))

            fwd_end = [0]
            peaks, _ = _run_step(fake, {"img": images}, opt, stand_in_loss, tracker, autocast)
        accounting.remove()
    loss_peak = loss_model(batch, anchors(imgsz, model.stride.tolist()), objects)
    phases = {
        "forward": peaks["forward"],
        "loss": fwd_end[0] + loss_peak,
        # the stand-in loss's backward allocates the predictions' gradients as the real one does; the real loss's
        # saved tensors (residual) are freed by its own backward before the model's backward allocates more
        "backward": peaks["backward"],
        "optimizer": peaks["optimizer"],
    }
    rows = [
        LayerRow(i, str(m.type).rsplit(".", 1)[-1], *accounting.rows[i], per_layer_flops[i], recompute_mode_of(m))
        for i, m in enumerate(fake.model)
    ]
    return StepProfile(
        source="fake_estimate",
        recompute=policy.spec,
        mode=mode,
        batch=batch,
        imgsz=imgsz,
        objects=objects,
        static_bytes=static,
        phase_peak_bytes=phases,
        loss_bytes=loss_peak,
        peak_bytes=max(phases.values()),
        layers=rows,
    )
