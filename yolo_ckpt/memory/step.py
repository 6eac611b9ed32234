"""The measured training step: one step of a copy of the model (forward, loss with targets, backward, optimizer
step), its peak memory per phase and per layer, for every task and device.

:func:`profile_step` is the one training-step harness; the trainer's run-report probe, the CLI and the benchmark
measure through it. :func:`run_step` is the step itself, with any counter: the CUDA allocator
(:class:`~yolo_ckpt.memory.tracker.CudaAllocator`) or live tensors (:class:`~yolo_ckpt.memory.tracker.LiveTensorTracker`,
on any device, on fake tensors too: the estimate's fake pass runs it). The step trains on the task's batch
(:func:`yolo_ckpt.memory.synthetic_batch.training_batch`) with the optimizer Ultralytics builds
(:func:`yolo_ckpt.memory.ultralytics_rules.build_optimizer`, its state counted as built); the image size a run trains
at is :func:`yolo_ckpt.memory.ultralytics_rules.train_imgsz`. :class:`StepProfile` is its result, measured, estimated
(:mod:`yolo_ckpt.memory.estimate`) or composed (:class:`yolo_ckpt.memory.memory_model.MemoryModel`).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch

from .layer_accounting import LayerAccounting, LayerRow, ModuleRow, module_flops
from .tracker import CudaAllocator, LiveTensorTracker, tensor_bytes
from .ultralytics_rules import autocast_for, build_optimizer


@dataclass
class StepProfile:
    """Peak memory of one training step (forward, loss with targets, backward, optimizer step), in bytes.

    Attributes:
        source: ``"cpu_live_tensors"`` (measured), ``"cuda_allocator"`` (measured), ``"fake_estimate"`` or
            ``"composed_estimate"`` (:meth:`yolo_ckpt.memory.memory_model.MemoryModel.step`).
        static_bytes: parameters, buffers, optimizer state and the input batch, alive all step long.
        phase_peak_bytes: the peak inside each phase: ``forward``, ``loss``, ``backward``, ``optimizer``.
        loss_bytes: the loss/assigner's own share: its peak above what was alive before it (grows with anchors,
            i.e. imgsz squared, and with objects per image).
        peak_bytes: the step's peak.
        layers: one :class:`~yolo_ckpt.memory.layer_accounting.LayerRow` per layer of ``model.model``.
        input_bytes: the training batch's share of ``static_bytes`` (images, targets, masks); it scales with
            batch x imgsz^2 as activations do.
        modules: one :class:`~yolo_ckpt.memory.layer_accounting.ModuleRow` per module recomputed on its own below
            the layers (inner blocks of nested layers, head branches), by qualified name.
        kept_bytes: what every phase of an estimate holds beyond ``static_bytes``: the bytes the loss keeps alive from
            its first call on (:attr:`yolo_ckpt.memory.loss_model.LossModel.kept`); 0 for a measurement, whose phases
            hold them as they are.
    """

    source: str
    recompute: str
    mode: str
    batch: int
    imgsz: int
    objects: int
    static_bytes: int
    phase_peak_bytes: dict
    loss_bytes: int
    peak_bytes: int
    layers: list = field(default_factory=list)
    input_bytes: int = 0
    modules: dict = field(default_factory=dict)
    kept_bytes: int = 0

    @classmethod
    def from_dict(cls, data: dict) -> StepProfile:
        """A profile from its ``dataclasses.asdict`` (the estimate cache's JSON): rows back to their classes."""
        return cls(**{
            **data,
            "layers": [LayerRow(**row) for row in data["layers"]],
            "modules": {name: ModuleRow(**row) for name, row in data["modules"].items()},
        })


def probe_training_step(model: torch.nn.Module, batch: dict, optimizer: str = "AdamW", amp: bool = False) -> int:
    """Peak bytes of one training step of a copy of ``model`` on ``batch``, as applied: :func:`profile_step` with
    ``recompute=None`` and no per-layer FLOPs (the run report's probe).

    Args:
        model: an Ultralytics ``BaseModel`` with ``.args`` set (its loss needs the hyperparameters).
        batch: a preprocessed training batch (``img`` (B, C, H, W) float in [0, 1], C the model's input channels,
            and the task's targets), on the model's device; give the first full-size batch of the run.
        optimizer, amp: the run's optimizer (its resolved name, e.g. ``trainer.args.optimizer`` after
            ``build_optimizer``) and AMP setting.

    Returns:
        Peak bytes: parameters, buffers, gradients, optimizer state, the batch and activations alive at once.
    """
    return profile_step(model, batch, None, optimizer=optimizer, amp=amp, flops=False).peak_bytes


def probe_validation_step(model: torch.nn.Module, images: torch.Tensor) -> int:
    """Peak live-tensor bytes of one inference forward pass (validation) of ``model`` on ``images`` (B, C, H, W)."""
    probe = copy.deepcopy(model).eval()
    with torch.inference_mode(), LiveTensorTracker() as tracker:
        tracker.track(list(probe.parameters()), list(probe.buffers()), images)
        probe(images)
    return tracker.peak_bytes


def run_step(model, batch, optimizer, loss_fn, tracker, autocast=None, after_backward=None):
    """Forward, loss, backward, optimizer step; returns the per-phase peaks, the bytes alive before the loss and the
    optimizer state's bytes. ``autocast`` (a context manager) covers the forward and the loss, as in Ultralytics'
    training step; ``after_backward`` (no arguments) is called between the backward and the optimizer step, while the
    gradients are there. The predictions are dropped once ``loss_fn`` has them, as Ultralytics' ``model.loss`` drops
    its own: the backward keeps only what the loss saved of them.

    An optimizer without state creates it in this step's optimizer phase (whose peak is then a later step's: the
    state plus the update's temporaries); every later step carries it all along, so its bytes are added to the
    earlier phases' peaks: one step measures a steady-state step, without a first one to create the state.
    ``optimizer=None`` stops after the backward (``optimizer`` peak and state 0: the caller has them from elsewhere)."""
    autocast = autocast or contextlib.nullcontext
    fresh = optimizer is not None and not optimizer.state
    peaks = {}
    tracker.start_phase()
    with autocast():
        preds = model(batch["img"])
    peaks["forward"] = tracker.phase_peak_bytes
    before_loss = tracker.start_phase()
    with autocast():
        loss = loss_fn(preds)
    del preds
    peaks["loss"] = tracker.phase_peak_bytes
    tracker.start_phase()
    loss.backward()
    del loss
    peaks["backward"] = tracker.phase_peak_bytes
    if after_backward is not None:
        after_backward()
    if optimizer is None:
        return {**peaks, "optimizer": 0}, before_loss, 0
    tracker.start_phase()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    peaks["optimizer"] = tracker.phase_peak_bytes
    state = tensor_bytes([list(s.values()) for s in optimizer.state.values()])
    if fresh:
        peaks.update({p: peaks[p] + state for p in ("forward", "loss", "backward")})
        before_loss += state
    return peaks, before_loss, state


def profile_step(
    model,
    batch: dict,
    recompute="none",
    mode: str = "full",
    optimizer: str = "AdamW",
    amp: bool = False,
    flops: bool = True,
    loss_chunk: int | None = None,
    assign_chunk: int | None = None,
    attn_chunk: int | None = None,
    state: dict | None = None,
) -> StepProfile:
    """Measure one real training step of a copy of ``model``: forward and loss (under autocast for ``amp``),
    backward, optimizer step; per phase and per layer. The one step-measurement harness, any task, any device.

    On CUDA the peaks come from the allocator (``max_memory_allocated``), less what was on the device before the
    copy was made (the live model, other tensors), plus the batch; elsewhere from
    :class:`~yolo_ckpt.memory.tracker.LiveTensorTracker`. The optimizer is built by
    :func:`~yolo_ckpt.memory.ultralytics_rules.build_optimizer` and its state counted all step long, as in every step
    after the first (:func:`run_step`). Not modelled: ``GradScaler``'s loss scaling (a few scalars), DDP buckets. The
    live model, its BatchNorm statistics and the RNG are untouched.

    Args:
        model: an Ultralytics ``BaseModel`` of a task in :data:`~yolo_ckpt.memory.ultralytics_rules.TASKS`, with
            ``.args`` set.
        batch: a preprocessed training batch (:func:`~yolo_ckpt.memory.synthetic_batch.training_batch`), on the
            model's device.
        recompute, mode: the policy (``yolo_ckpt.checkpointing.policy``) and ``recompute_mode`` to apply to the copy; ``None``
            keeps what is applied to ``model`` (a ``deepcopy`` keeps it).
        optimizer: an Ultralytics optimizer name (:func:`~yolo_ckpt.memory.ultralytics_rules.build_optimizer`),
            ``auto`` meaning AdamW.
        amp: autocast the forward and loss (:func:`~yolo_ckpt.memory.ultralytics_rules.autocast_for`).
        flops: count per-layer forward FLOPs (one more forward pass); 0 when False.
        loss_chunk, assign_chunk, attn_chunk: the loss and attention regions' chunks where ``recompute`` applies
            them (:func:`yolo_ckpt.checkpointing.engine.apply_checkpointing`); None: their defaults.
        state: a dict to fill with what the step computed, for exactness checks: the copy's gradients after the
            backward (``"grad:<parameter name>"``) and its buffers after the step (``"buffer:<name>"``: BatchNorm
            statistics). References, nothing copied: the peak is the same with and without it.

    Returns:
        The :class:`StepProfile` (``source`` says which counter; ``recompute`` the layers recomputed).
    """
    from ..checkpointing.engine import apply_checkpointing, checkpointed_layers

    cuda = batch["img"].device.type == "cuda"
    before = torch.cuda.memory_allocated() if cuda else 0
    probe = copy.deepcopy(model).train()
    spec = ",".join(map(str, checkpointed_layers(probe))) or "none"
    if recompute is not None:
        spec = apply_checkpointing(
            probe, recompute, mode=mode, loss_chunk=loss_chunk, assign_chunk=assign_chunk, attn_chunk=attn_chunk
        ).spec
    opt = build_optimizer(probe, optimizer)
    flop_counts = module_flops(probe, batch["img"]) if flops else {}
    autocast = autocast_for(amp, batch["img"].device.type)

    def loss_fn(preds):
        return probe.loss(batch, preds)[0].sum()

    accounting = LayerAccounting(probe)

    def keep_gradients():
        if state is not None:
            state.update({f"grad:{n}": p.grad for n, p in probe.named_parameters() if p.grad is not None})

    try:
        with torch.random.fork_rng(devices=[batch["img"].device] if cuda else []):
            if cuda:
                offset = tensor_bytes(batch) - before
                counter = CudaAllocator()
                static = counter.start_phase() + offset
                peaks, before_loss, state_bytes = run_step(probe, batch, opt, loss_fn, counter, autocast, keep_gradients)
                peaks = {k: v + offset for k, v in peaks.items()}
                before_loss += offset
            else:
                with LiveTensorTracker() as tracker:
                    tracker.track(list(probe.parameters()), list(probe.buffers()), batch)
                    static = tracker.live_bytes
                    peaks, before_loss, state_bytes = run_step(probe, batch, opt, loss_fn, tracker, autocast, keep_gradients)
    finally:
        accounting.remove()
    if state is not None:
        state.update({f"buffer:{n}": b for n, b in probe.named_buffers()})
    rows, modules = accounting.profile_rows(probe, flop_counts)
    return StepProfile(
        source="cuda_allocator" if cuda else "cpu_live_tensors",
        recompute=spec,
        mode=mode,
        batch=len(batch["img"]),
        imgsz=batch["img"].shape[-1],
        objects=int(len(batch["batch_idx"]) // max(len(batch["img"]), 1)) if "batch_idx" in batch else 0,
        static_bytes=static + state_bytes,
        phase_peak_bytes=peaks,
        loss_bytes=peaks["loss"] - before_loss,
        peak_bytes=max(peaks.values()),
        layers=rows,
        input_bytes=tensor_bytes(batch),
        modules=modules,
    )
