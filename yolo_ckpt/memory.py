"""Measure peak training memory: the CUDA allocator's peak, and peak live-tensor bytes on any device (CPU).

On CUDA the caching allocator keeps the peak (``torch.cuda.max_memory_allocated``). The CPU has no such counter,
so :class:`LiveTensorTracker` counts it the way the allocator would: it sees every tensor an operator creates
(a ``TorchDispatchMode``, forward and backward alike), adds its storage's bytes while the storage is alive and
subtracts them when the storage is freed (a ``weakref.finalize``). The same idea as PyTorch's
``torch.distributed._tools.mem_tracker.MemTracker``, which is private API (it may change in any release) and fails
on parameters that do not require grad, as YOLO's DFL convolution does; hence this small tracker.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode


class LiveTensorTracker(TorchDispatchMode):
    """Peak bytes of tensor storages alive while the mode is active.

    Storages created by operators inside the block are counted from creation to deallocation; tensors passed to
    :meth:`track` (parameters, inputs) are counted from then on. Views share their base's storage and are not
    counted twice.

    Attributes:
        live_bytes: bytes alive now.
        peak_bytes: the largest ``live_bytes`` seen, in bytes.
    """

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.phase_peak_bytes = 0
        self._live: dict[int, int] = {}

    def start_phase(self) -> int:
        """Restart ``phase_peak_bytes`` from the bytes alive now, and return them."""
        self.phase_peak_bytes = self.live_bytes
        return self.live_bytes

    def track(self, *tensors) -> None:
        """Count these tensors' storages (nested lists/dicts allowed) as alive from now on."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" or t.is_sparse:
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live:
            return
        self._live[key] = storage.nbytes()
        self.live_bytes += self._live[key]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.phase_peak_bytes = max(self.phase_peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.track(out)
        return out


def probe_training_step(model: torch.nn.Module, batch: dict) -> int:
    """Peak live-tensor bytes of one training step (forward, loss with targets, backward) of a copy of ``model``.

    The live model, its BatchNorm statistics and the global RNG are untouched: the probe runs on a ``deepcopy``
    (which keeps any activation checkpointing applied to the model).

    Args:
        model: an Ultralytics ``BaseModel`` with ``.args`` set (its loss needs the hyperparameters).
        batch: a preprocessed training batch: ``img`` (B, 3, H, W) float in [0, 1] and the task's targets.

    Returns:
        Peak bytes: parameters, buffers, the batch, activations and gradients alive at the same time.
    """
    probe = copy.deepcopy(model).train()
    with torch.random.fork_rng(devices=[]), LiveTensorTracker() as tracker:
        tracker.track(list(probe.parameters()), list(probe.buffers()), batch)
        loss, _ = probe.loss(batch)
        loss.sum().backward()
    return tracker.peak_bytes


def probe_validation_step(model: torch.nn.Module, images: torch.Tensor) -> int:
    """Peak live-tensor bytes of one inference forward pass (validation) of ``model`` on ``images`` (B, 3, H, W)."""
    probe = copy.deepcopy(model).eval()
    with torch.inference_mode(), LiveTensorTracker() as tracker:
        tracker.track(list(probe.parameters()), list(probe.buffers()), images)
        probe(images)
    return tracker.peak_bytes


@dataclass
class LayerRow:
    """One layer's share of a training step.

    Attributes:
        index, type: the layer ``model.model[index]`` and the last part of its ``type``.
        output_bytes: bytes of the layer's output tensors.
        saved_bytes: bytes of the tensors autograd saves for backward during the layer's forward, counted at the
            first layer that saves each storage (so the rows add up to the step's total). A recomputed layer saves
            none: its input is kept by the checkpoint instead.
        freeable_bytes: the part of ``saved_bytes`` that recomputing the layer frees: all but its inputs, which
            the checkpoint keeps (an input saved here is often the previous layer's output, alive anyway).
        forward_flops: FLOPs of the layer's forward pass (``torch.utils.flop_counter``), the cost of recomputing it.
        recompute: ``"full"``, ``"selective"`` or ``None``: how the layer, or for the head its branches, is recomputed.
    """

    index: int
    type: str
    output_bytes: int
    saved_bytes: int
    freeable_bytes: int
    forward_flops: int
    recompute: str | None


@dataclass
class StepProfile:
    """Peak memory of one training step (forward, loss with targets, backward, optimizer step), in bytes.

    Attributes:
        source: ``"cpu_live_tensors"`` (measured), ``"cuda_allocator"`` (measured) or ``"fake_estimate"``.
        static_bytes: parameters, buffers, optimizer state and the input batch, alive all step long.
        phase_peak_bytes: the peak inside each phase: ``forward``, ``loss``, ``backward``, ``optimizer``.
        loss_bytes: the loss/assigner's own share: its peak above what was alive before it (grows with anchors,
            i.e. imgsz squared, and with objects per image).
        peak_bytes: the step's peak.
        layers: one :class:`LayerRow` per layer of ``model.model``.
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


def anchors(imgsz: int, strides) -> int:
    """Anchor points of a detection head at ``imgsz``: sum over strides of (imgsz / stride)^2."""
    return int(sum((imgsz // int(s)) ** 2 for s in strides))


def detect_batch(batch: int, imgsz: int, objects: int, seed: int = 0) -> dict:
    """A fixed detection training batch: (batch, 3, imgsz, imgsz) images in [0, 1], ``objects`` boxes per image.

    Boxes are small (1-5 % of the image side), as in aerial scenes, and the same for a given seed.
    """
    g = torch.Generator().manual_seed(seed)
    n = batch * objects
    xy = torch.rand(n, 2, generator=g) * 0.8 + 0.1
    wh = torch.rand(n, 2, generator=g) * 0.04 + 0.01
    return {
        "img": torch.rand(batch, 3, imgsz, imgsz, generator=g),
        "batch_idx": torch.arange(batch).repeat_interleave(objects).float(),
        "cls": torch.randint(0, 3, (n, 1), generator=g).float(),
        "bboxes": torch.cat([xy, wh], 1),
    }


class _LayerAccounting:
    """Forward hooks on each layer that attribute output and saved-for-backward bytes to it."""

    def __init__(self, model):
        self.rows = {i: [0, 0, 0] for i in range(len(model.model))}  # index -> [output, saved, freeable] bytes
        self._seen: set[int] = set()
        self._inputs: set[int] = set()
        self._stack: list = []
        self._handles = []
        for i, layer in enumerate(model.model):
            self._handles.append(layer.register_forward_pre_hook(self._pre(i)))
            self._handles.append(layer.register_forward_hook(self._post(i), always_call=True))

    def _pre(self, i):
        def hook(module, args):
            self._inputs = {t.untyped_storage()._cdata for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
            ctx = torch.autograd.graph.saved_tensors_hooks(self._pack(i), lambda t: t)
            ctx.__enter__()
            self._stack.append(ctx)

        return hook

    def _post(self, i):
        def hook(module, args, output):
            self._stack.pop().__exit__(None, None, None)
            outs = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tree_leaves(output) if isinstance(t, torch.Tensor)}
            self.rows[i][0] += sum(outs.values())

        return hook

    def _pack(self, i):
        def pack(t):
            key = t.untyped_storage()._cdata
            if key not in self._seen:
                self._seen.add(key)
                self.rows[i][1] += t.untyped_storage().nbytes()
                if key not in self._inputs:
                    self.rows[i][2] += t.untyped_storage().nbytes()
            return t

        return pack

    def remove(self):
        for h in self._handles:
            h.remove()


def layer_flops(model, images: torch.Tensor) -> list[int]:
    """Forward FLOPs of each layer of ``model.model`` on ``images`` (works on fake tensors too)."""
    with FlopCounterMode(display=False) as counter:
        model(images)
    counts = counter.get_flop_counts()
    root = type(model).__name__
    return [int(sum(counts.get(f"{root}.model.{i}", {}).values())) for i in range(len(model.model))]


def _run_step(model, batch, optimizer, loss_fn, tracker, autocast=None):
    """Forward, loss, backward, optimizer step; returns the per-phase peaks and the bytes alive before the loss.
    ``autocast`` (a context manager) covers the forward and the loss, as in Ultralytics' training step."""
    autocast = autocast or contextlib.nullcontext
    peaks = {}
    tracker.start_phase()
    with autocast():
        preds = model(batch["img"])
    peaks["forward"] = tracker.phase_peak_bytes
    before_loss = tracker.start_phase()
    with autocast():
        loss = loss_fn(preds)
    peaks["loss"] = tracker.phase_peak_bytes
    tracker.start_phase()
    loss.backward()
    del loss, preds
    peaks["backward"] = tracker.phase_peak_bytes
    tracker.start_phase()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    peaks["optimizer"] = tracker.phase_peak_bytes
    return peaks, before_loss


def optimizer_for(name: str = "auto", iterations: int = 0) -> str:
    """The optimizer whose state to count for Ultralytics' ``optimizer=``: ``auto`` picks AdamW up to 10000
    iterations and MuSGD beyond (``BaseTrainer.build_optimizer``); Adam-like ones keep AdamW's 2 states per
    parameter, SGD-like ones 1."""
    name = str(name)
    if name.lower() == "auto":
        return "MuSGD" if iterations > 10000 else "AdamW"
    return "SGD" if name.lower() in {"sgd", "musgd", "rmsprop"} else "AdamW"


def build_optimizer(model, name: str = "AdamW"):
    """The optimizer whose state a step carries: ``AdamW`` (2 states per parameter, what ``optimizer=auto`` picks
    for short runs) or ``SGD`` (momentum: 1 state; ``MuSGD`` of long auto runs keeps the same)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "AdamW":
        return torch.optim.AdamW(params, lr=1e-6, foreach=False)
    if name in {"SGD", "MuSGD"}:
        return torch.optim.SGD(params, lr=1e-6, momentum=0.9, foreach=False)
    raise ValueError(f"optimizer={name!r} is not modelled; valid: AdamW, SGD, MuSGD")


def profile_step(model, batch: dict, recompute="none", mode: str = "full", optimizer: str = "AdamW") -> StepProfile:
    """Measure one real training step of a copy of ``model`` with a recompute policy, per phase and per layer.

    On CUDA the peaks come from the allocator (``max_memory_allocated``); elsewhere from
    :class:`LiveTensorTracker`. The optimizer state exists (a first, untracked step creates it), as in every
    step after the first. The live model is untouched.

    Args:
        model: an Ultralytics detection ``BaseModel`` with ``.args`` set.
        batch: a training batch (:func:`detect_batch`), on the model's device.
        recompute, mode: the policy (``yolo_ckpt.policy``) and ``recompute_mode``.
        optimizer: see :func:`build_optimizer`.

    Returns:
        The :class:`StepProfile` (``source`` says which counter).
    """
    from .engine import apply_checkpointing, recompute_mode_of

    probe = copy.deepcopy(model).train()
    policy = apply_checkpointing(probe, recompute, mode=mode)
    opt = build_optimizer(probe, optimizer)
    flops = layer_flops(probe, batch["img"])
    probe.zero_grad(set_to_none=True)

    def loss_fn(preds):
        return probe.loss(batch, preds)[0].sum()

    _run_step(probe, batch, opt, loss_fn, LiveTensorTracker())  # creates the optimizer state
    accounting = _LayerAccounting(probe)
    cuda = batch["img"].device.type == "cuda"
    try:
        if cuda:
            peaks, before_loss, static = _cuda_step(probe, batch, opt, loss_fn)
        else:
            with torch.random.fork_rng(devices=[]), LiveTensorTracker() as tracker:
                state = [t for s in opt.state.values() for t in s.values()]
                tracker.track(list(probe.parameters()), list(probe.buffers()), state, batch)
                static = tracker.live_bytes
                peaks, before_loss = _run_step(probe, batch, opt, loss_fn, tracker)
    finally:
        accounting.remove()
    rows = [
        LayerRow(i, str(m.type).rsplit(".", 1)[-1], *accounting.rows[i], flops[i], recompute_mode_of(m))
        for i, m in enumerate(probe.model)
    ]
    return StepProfile(
        source="cuda_allocator" if cuda else "cpu_live_tensors",
        recompute=policy.spec,
        mode=mode,
        batch=len(batch["img"]),
        imgsz=batch["img"].shape[-1],
        objects=int(len(batch["cls"]) // max(len(batch["img"]), 1)),
        static_bytes=static,
        phase_peak_bytes=peaks,
        loss_bytes=peaks["loss"] - before_loss,
        peak_bytes=max(peaks.values()),
        layers=rows,
    )


def _cuda_step(model, batch, optimizer, loss_fn):
    """:func:`_run_step` with the CUDA allocator as the counter."""

    class _Allocator:
        live_bytes = property(lambda self: torch.cuda.memory_allocated())
        phase_peak_bytes = property(lambda self: torch.cuda.max_memory_allocated())

        def start_phase(self):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated()

    counter = _Allocator()
    static = counter.start_phase()
    peaks, before_loss = _run_step(model, batch, optimizer, loss_fn, counter)
    return peaks, before_loss, static
