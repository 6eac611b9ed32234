"""Estimate the peak memory of a training step without computing it: a fake pass plus the loss formula.

The model's forward, backward and optimizer step run on fake tensors (``torch._subclasses.FakeTensorMode``: shapes,
dtypes and storages, no data; :func:`~yolo_ckpt.memory.fake_copy.fake_copy`), with the recompute policy applied, and
:class:`~yolo_ckpt.memory.tracker.LiveTensorTracker` counts the live storages as on the CPU: parameters, buffers,
gradients, the optimizer state Ultralytics' own builder gives
(:func:`~yolo_ckpt.memory.ultralytics_rules.build_optimizer`), the task's training batch
(:func:`~yolo_ckpt.memory.synthetic_batch.training_batch`) and activations, per phase and per layer
(:class:`~yolo_ckpt.memory.layer_accounting.LayerAccounting`). Fake tensors cannot run the loss: the fake pass
backpropagates a stand-in loss (:func:`~yolo_ckpt.memory.layer_accounting.stand_in_loss`: dense gradients of the
predictions' shapes, nothing saved), and the loss's own peaks are a formula
(:class:`~yolo_ckpt.memory.loss_model.LossModel`, calibrated by
:func:`~yolo_ckpt.memory.loss_calibration.calibrate_loss`) put on top (:func:`with_loss_phases`).

Not counted: the dataloader and its workers, validation (a separate phase), CUDA's context and cuDNN workspaces,
allocator fragmentation (``memory_reserved`` above ``memory_allocated``), GradScaler and DDP buffers.

AMP (Ultralytics runs it on CUDA only): the fake pass runs under CUDA fp16 autocast's dtypes, emulated on the CPU
(:func:`yolo_ckpt.memory.amp.cuda_amp_emulated`: CPU autocast in fp16, with the ops CUDA autocast keeps in fp32,
softmax among them, run in fp32).
"""

from __future__ import annotations

import copy
import dataclasses

from ..checkpointing.engine import apply_checkpointing
from .amp import cuda_amp_emulated
from .fake_copy import fake_copy
from .layer_accounting import LayerAccounting, module_flops, stand_in_loss
from .loss_calibration import calibrate_loss
from .loss_model import LossModel
from .step import StepProfile, run_step
from .synthetic_batch import training_batch
from .tracker import LiveTensorTracker, tensor_bytes
from .ultralytics_rules import build_optimizer, train_imgsz


def estimate_step(
    model,
    imgsz,
    batch: int,
    objects: int = 20,
    recompute="none",
    mode: str = "full",
    optimizer: str = "AdamW",
    amp: bool = False,
    loss_model: LossModel | None = None,
    flops: bool = True,
    optimizer_from: StepProfile | None = None,
    sizes=None,
    attn_chunk: int | None = None,
) -> StepProfile:
    """Estimate one training step's peak memory (bytes) for ``model`` without computing anything.

    Args:
        model: an Ultralytics ``BaseModel`` of a task in :data:`~yolo_ckpt.memory.ultralytics_rules.TASKS` (real parameters; it is
            copied onto fake tensors), with ``.args`` set.
        imgsz: the ``imgsz=`` of the run: an int, a list or a string; estimated at the size it trains at
            (:func:`~yolo_ckpt.memory.ultralytics_rules.train_imgsz`: 2736 -> 2752). batch: images per step.
        objects: targets per image (the loss grows with it: take the dataset's maximum, as AutoBatch does).
        recompute, mode: the policy and ``recompute_mode`` to estimate.
        optimizer: an Ultralytics optimizer name (:func:`yolo_ckpt.memory.ultralytics_rules.build_optimizer`); its state as built.
        amp: estimate a CUDA AMP step: CUDA fp16 autocast's dtypes (see the module docstring).
        loss_model: the loss formula; when None :func:`~yolo_ckpt.memory.loss_calibration.calibrate_loss` of
            ``model``, or where ``recompute`` applies the loss region (``yolo_ckpt.checkpointing.losses``), of a copy
            of ``model`` with it applied.
        flops: count per-layer forward FLOPs (a second fake forward pass).
        optimizer_from: an earlier estimate of the same model and optimizer (any policy, batch and imgsz) whose
            optimizer phase and state this one takes instead of running the step (a quarter of a pass's time):
            that phase holds the parameters, buffers, gradients, optimizer state and the batch (and the loss's
            ``kept_bytes``, taken out), so it differs between the two only by their batches' bytes (``input_bytes``).
        sizes: the training set's :class:`~yolo_ckpt.memory.foreground.ObjectSizes`, which bound a segmentation loss's
            foreground anchors by its boxes' sizes (:meth:`~yolo_ckpt.memory.loss_model.LossModel.foreground`); None:
            ``objects * topk`` per image.
        attn_chunk: the attention region's chunk where ``recompute`` applies it (``attn_chunk=``); None: its default.
            The fake pass runs the region's chunk loops, so its working set is counted as it runs.

    Returns:
        A :class:`~yolo_ckpt.memory.step.StepProfile` with ``source="fake_estimate"`` and ``imgsz`` the trained size.

    Raises:
        ValueError, TypeError: for a task that is not modelled, an unknown optimizer or an invalid imgsz.
    """
    imgsz = train_imgsz(imgsz, model.stride)
    with fake_copy(model) as (fake_mode, fake):
        policy = apply_checkpointing(fake, recompute, mode=mode, attn_chunk=attn_chunk)
        if loss_model is None:
            region = model
            if getattr(fake, "loss_chunk", None) != getattr(model, "loss_chunk", None):  # the policy sets a loss region
                region = copy.deepcopy(model)
                apply_checkpointing(region, recompute, mode=mode)
            loss_model = calibrate_loss(region, amp)
        with fake_mode:
            data = training_batch(model, batch, imgsz, objects)
            flop_counts = module_flops(fake, data["img"]) if flops else {}
            opt = build_optimizer(fake, optimizer) if optimizer_from is None else None
            for group in opt.param_groups if opt else ():  # foreach kernels (CUDA's default): a few ops, not a few per
                group["foreach"] = True  # parameter, on fake tensors; the state they keep is the same
            accounting = LayerAccounting(fake)
            with LiveTensorTracker() as tracker, cuda_amp_emulated(amp) as autocast:  # backward included: yolo_ckpt.memory.amp
                tracker.track(list(fake.parameters()), list(fake.buffers()), data)
                static = tracker.live_bytes
                accounting.tracker = tracker  # each layer's backward peak (LayerRow.backward_peak_bytes)

                def loss_fn(preds):
                    fwd_end[0] = tracker.live_bytes
                    return stand_in_loss(preds)

                fwd_end = [0]
                peaks, _, state = run_step(fake, data, opt, loss_fn, tracker, autocast)
            accounting.remove()
        inputs = tensor_bytes(data)
        if optimizer_from is not None:  # its state: its static bytes less its parameters, buffers and batch (as ours)
            earlier = optimizer_from
            state = earlier.static_bytes - earlier.input_bytes - (static - inputs)
            peaks = {p: v + state for p, v in peaks.items()} | {
                "optimizer": earlier.phase_peak_bytes["optimizer"] - earlier.kept_bytes - earlier.input_bytes + inputs
            }
        static, fwd_end[0] = static + state, fwd_end[0] + state  # the optimizer state, counted in every phase
        for peaks_of in (accounting.forward_peaks, accounting.backward_peaks):
            peaks_of.update({i: peak + state for i, peak in peaks_of.items()})
        # the stand-in loss holds nothing: the loss phase is the forward's end, the loss's own peaks go on top of it
        phases = {"forward": peaks["forward"], "loss": fwd_end[0], "backward": peaks["backward"], "optimizer": peaks["optimizer"]}
        rows, modules = accounting.profile_rows(fake, flop_counts)
    network = StepProfile(
        source="fake_estimate",
        recompute=policy.spec,
        mode=mode,
        batch=batch,
        imgsz=imgsz,
        objects=objects,
        static_bytes=static,
        phase_peak_bytes=phases,
        loss_bytes=0,
        peak_bytes=max(phases.values()),
        layers=rows,
        input_bytes=inputs,
        modules=modules,
    )
    return with_loss_phases(
        network,
        loss_model.forward_bytes(batch, imgsz, objects, sizes),
        loss_model.backward_bytes(batch, imgsz, objects, sizes),
        loss_model.kept,
    )


def with_loss_phases(step: StepProfile, forward: int, backward: int, kept: int = 0) -> StepProfile:
    """``step``, a fake pass whose loss holds nothing (its ``loss`` phase is the forward's end: a stand-in loss, or
    a formula of zeros), with the loss's peaks on top: ``forward`` bytes (the loss's forward peak above what was
    alive before it) in the loss phase, and in the backward phase the loss's own backward, ``backward`` bytes above
    the forward's end, which runs before the model's (whose peak the stand-in's backward gives; the loss's saved
    tensors are freed by then). ``kept`` bytes (:attr:`~yolo_ckpt.memory.loss_model.LossModel.kept`) are alive in
    every phase (:attr:`~yolo_ckpt.memory.step.StepProfile.kept_bytes`). ``loss_bytes`` becomes ``forward``. Used by
    :func:`estimate_step` and by :meth:`yolo_ckpt.memory.composed.ComposedEstimate.estimate`, which composes each
    policy's loss on one pass of its layers."""
    end = step.phase_peak_bytes["loss"]
    phases = step.phase_peak_bytes | {"loss": end + forward, "backward": max(step.phase_peak_bytes["backward"], end + backward)}
    phases = {phase: peak + kept for phase, peak in phases.items()}
    return dataclasses.replace(
        step, phase_peak_bytes=phases, loss_bytes=forward, peak_bytes=max(phases.values()), kept_bytes=step.kept_bytes + kept
    )
