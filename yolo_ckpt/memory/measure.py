"""Measure peak training memory: the CUDA allocator's peak, and peak live-tensor bytes on any device (CPU).

:func:`profile_step` is the one training-step harness (forward, loss with targets, backward, optimizer step) for
every task and device; the trainer's run-report probe, the CLI and the benchmark measure through it.
:func:`training_batch` builds a fixed training batch for any task and class count and :func:`build_optimizer` the
optimizer Ultralytics builds (its state is counted as built); the image size a run trains at is
:func:`yolo_ckpt.memory.runspec.train_imgsz`.

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
import logging
import math
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from ..errors import ConfigError


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
        self.mark_peak_bytes = 0
        self._live: dict[int, int] = {}

    def start_phase(self) -> int:
        """Restart ``phase_peak_bytes`` from the bytes alive now, and return them."""
        self.phase_peak_bytes = self.live_bytes
        return self.live_bytes

    def mark(self) -> int:
        """The peak bytes since the last mark (or since the tracker began); the next mark's starts from now."""
        peak, self.mark_peak_bytes = self.mark_peak_bytes, self.live_bytes
        return peak

    def track(self, *tensors) -> None:
        """Count these tensors' storages (nested lists/dicts allowed) as alive from now on."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        if t.is_meta or t.is_sparse:
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live:
            return
        self._live[key] = nbytes = storage.nbytes()
        self.live_bytes = live = self.live_bytes + nbytes
        self.peak_bytes = max(self.peak_bytes, live)
        self.phase_peak_bytes = max(self.phase_peak_bytes, live)
        self.mark_peak_bytes = max(self.mark_peak_bytes, live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # an operator returns a tensor or a tuple or list of them (and of other values): no pytree walk, the
        # tracker's largest cost on small real tensors (a loss calibration's)
        if isinstance(out, torch.Tensor):
            self._add(out)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._add(t)
                elif isinstance(t, (tuple, list, dict)):
                    self.track(t)
        return out


def probe_training_step(model: torch.nn.Module, batch: dict, optimizer: str = "AdamW", amp: bool = False) -> int:
    """Peak bytes of one training step of a copy of ``model`` on ``batch``, as applied: :func:`profile_step` with
    ``recompute=None`` and no per-layer FLOPs (the run report's probe).

    Args:
        model: an Ultralytics ``BaseModel`` with ``.args`` set (its loss needs the hyperparameters).
        batch: a preprocessed training batch (``img`` (B, 3, H, W) float in [0, 1] and the task's targets), on the
            model's device; give the first full-size batch of the run.
        optimizer, amp: the run's optimizer (its resolved name, e.g. ``trainer.args.optimizer`` after
            ``build_optimizer``) and AMP setting.

    Returns:
        Peak bytes: parameters, buffers, gradients, optimizer state, the batch and activations alive at once.
    """
    return profile_step(model, batch, None, optimizer=optimizer, amp=amp, flops=False).peak_bytes


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
            the checkpoint keeps (an input saved here is often the previous layer's output, alive anyway), and the
            parameters and buffers (a convolution saves its weight), alive all step long.
        forward_flops: FLOPs of the layer's forward pass (``torch.utils.flop_counter``), the cost of recomputing it.
        recompute: ``"full"``, ``"selective"`` or ``None``: how the layer, or for the head its branches, is recomputed.
        forward_peak_bytes, backward_peak_bytes: the step's peak live bytes while the layer's forward ran, and while
            its backward ran (from its outputs' gradients to the next layer's), static bytes included; 0 where not
            measured (the fake estimate measures them).
    """

    index: int
    type: str
    output_bytes: int
    saved_bytes: int
    freeable_bytes: int
    forward_flops: int
    recompute: str | None
    forward_peak_bytes: int = 0
    backward_peak_bytes: int = 0


@dataclass
class ModuleRow:
    """One module below the layers that is recomputed on its own (``yolo_ckpt.checkpointing.engine.sub_regions``: an inner block
    of a nested layer, a head branch): its share of its layer's :class:`LayerRow`, counted by the same rules.

    Attributes:
        name: its qualified name under ``model.model`` (``"6.m.0.1"``, ``"23.cv2.0"``).
        saved_bytes: bytes autograd saves for backward in its forward (the storages its layer's row counts first here).
        freeable_bytes: the part of ``saved_bytes`` that recomputing it frees: all but its inputs, parameters
            and buffers.
        forward_flops: FLOPs of its forward pass (``torch.utils.flop_counter``).
    """

    name: str
    saved_bytes: int
    freeable_bytes: int
    forward_flops: int


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
        input_bytes: the training batch's share of ``static_bytes`` (images, targets, masks); it scales with
            batch x imgsz^2 as activations do.
        modules: one :class:`ModuleRow` per module recomputed on its own below the layers (inner blocks of nested
            layers, head branches), by qualified name.
        kept_bytes: an estimate's share of ``static_bytes`` that the loss keeps alive from its first call on
            (:attr:`yolo_ckpt.memory.estimate.LossModel.kept`); 0 for a measurement (its static bytes hold it).
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


def anchors(imgsz: int, strides) -> int:
    """Anchor points of a detection head at ``imgsz``: sum over strides of (imgsz / stride)^2."""
    return int(sum((imgsz // int(s)) ** 2 for s in strides))


# what training_batch, profile_step and the estimate know
TASKS = ("detect", "segment", "pose", "obb", "classify", "semantic", "depth")
OBJECTLESS_TASKS = ("classify", "semantic", "depth")  # targets per image or per pixel: no objects in their batch


def model_task(model) -> str:
    """The task of an Ultralytics model (``ultralytics.nn.tasks.guess_model_task``), one of :data:`TASKS`.

    Raises:
        ValueError: naming the model's task and the tasks that are modelled.
    """
    from ultralytics.nn.tasks import guess_model_task

    task = guess_model_task(model)
    if task not in TASKS:
        raise ValueError(f"{type(model).__name__} is a {task!r} model; memory is modelled for the tasks {', '.join(TASKS)}")
    return task


def training_batch(
    model, batch: int, imgsz: int, objects: int, seed: int = 0, sides: tuple[float, float] | None = None, boxes: torch.Tensor | None = None
) -> dict:
    """A fixed, preprocessed training batch for ``model``'s task and class count, as Ultralytics' collate gives it.

    ``img`` is (batch, 3, imgsz, imgsz) in [0, 1]. Detection-style tasks get ``objects`` boxes per image, laid on a
    grid of ceil(sqrt(objects)) cells per side, one object per cell filling 90-100 % of it: boxes do not overlap, so
    each object can claim its own ``topk`` anchors, the case the segmentation-loss formula bounds. With ``sides``
    (lo, hi), each box's width and height are drawn in [lo, hi] of the image side instead (small objects: 0.01 to
    0.03), still centred in its cell (larger than a cell, neighbours overlap). ``boxes`` (batch * objects, 4),
    normalised xywh, image by image, replaces the grid (any layout: overlapping, nested, on the edges); the masks,
    keypoints and angles follow them as they follow the grid's. Classes are drawn
    from the model's ``nc`` (one-class models get class 0). Per task:

    - detect: ``batch_idx`` (n,), ``cls`` (n, 1), ``bboxes`` (n, 4) normalised xywh, with n = batch * objects;
    - segment: also ``masks`` (batch, imgsz/r, imgsz/r) with r the model's ``args.mask_ratio`` (default 4), each
      object's box filled with its index + 1 (Ultralytics' default ``overlap_mask=True``; uint8, int32 past 255
      objects, as its dataset stores them; with ``args.overlap_mask=False`` one (n, imgsz/r, imgsz/r) float mask
      per object) and ``sem_masks`` (batch, imgsz/r, imgsz/r) float;
    - pose: also ``keypoints`` (n, K, 3) (normalised xy inside the box, visibility 2), K from the head's
      ``kpt_shape``;
    - obb: ``bboxes`` (n, 5) normalised xywh and an angle in radians;
    - classify: ``cls`` (batch,) int64 (no objects);
    - semantic: ``semantic_mask`` (batch, imgsz, imgsz) int32 class ids in [0, nc), every pixel valid (none the
      ignore id 255), as ``SemanticFormat`` gives the loss (no objects);
    - depth: ``depth`` (batch, 1, imgsz, imgsz) float32 metres in [1, 80], every pixel valid (> 0.001), as
      ``DepthFormat`` and ``DepthTrainer.preprocess_batch`` give it (no objects).

    Every pixel of a dense target is valid: the losses gather the valid pixels, so that is their largest step.

    Built from shapes and broadcasts only, so it also builds on fake tensors (``FakeTensorMode``).

    Raises:
        ValueError: for a task that is not modelled (see :func:`model_task`), or objects < 1 for a task with boxes.
    """
    task = model_task(model)
    head = model.model[-1]
    nc = int(getattr(head, "nc", None) or model.yaml["nc"])
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(batch, 3, imgsz, imgsz, generator=g)
    if task == "classify":
        return {"img": images, "cls": torch.randint(0, nc, (batch,), generator=g)}
    if task == "semantic":
        return {"img": images, "semantic_mask": torch.randint(0, nc, (batch, imgsz, imgsz), generator=g, dtype=torch.int32)}
    if task == "depth":
        return {"img": images, "depth": torch.rand(batch, 1, imgsz, imgsz, generator=g) * 79 + 1}
    if objects < 1:
        raise ValueError(f"objects={objects}: a {task} batch needs at least 1 object per image")
    out = {"img": images, **_grid_targets(batch, objects, nc, g, sides)}
    if boxes is not None:
        out["bboxes"] = boxes.float().reshape(batch * objects, 4)
    xywh = out["bboxes"]
    if task == "obb":
        out["bboxes"] = torch.cat([xywh, torch.rand(len(xywh), 1, generator=g) * math.pi / 2], 1)
    elif task == "pose":
        k = int(head.kpt_shape[0])
        xy = xywh[:, None, :2] + (torch.rand(len(xywh), k, 2, generator=g) - 0.5) * xywh[:, None, 2:]
        out["keypoints"] = torch.cat([xy, torch.full((len(xywh), k, 1), 2.0)], 2)
    elif task == "segment":
        overlap = getattr(getattr(model, "args", None), "overlap_mask", True)
        ratio = int(getattr(getattr(model, "args", None), "mask_ratio", 4))
        out.update(_grid_masks(batch, imgsz // ratio, objects, xywh, overlap))
    return out


def detect_batch(batch: int, imgsz: int, objects: int, seed: int = 0, nc: int = 1) -> dict:
    """A fixed detection training batch (:func:`training_batch`'s detect batch) for a model of ``nc`` classes,
    without the model: (batch, 3, imgsz, imgsz) images in [0, 1], ``objects`` grid-laid boxes per image."""
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.rand(batch, 3, imgsz, imgsz, generator=g), **_grid_targets(batch, objects, nc, g)}


def _grid_targets(batch: int, objects: int, nc: int, g: torch.Generator, sides: tuple[float, float] | None = None) -> dict:
    """``batch_idx``, ``cls`` and normalised xywh ``bboxes`` of ``objects`` boxes per image, one per grid cell,
    filling 90-100 % of it or, with ``sides`` (lo, hi), of sides in [lo, hi] (fractions of the image side)."""
    side = math.ceil(math.sqrt(objects))
    cell = torch.arange(objects).repeat(batch)
    centre = (torch.stack([cell % side, cell // side], 1) + 0.5) / side
    u = torch.rand(len(cell), 2, generator=g)
    wh = (u * 0.1 + 0.9) / side if sides is None else u * (sides[1] - sides[0]) + sides[0]
    return {
        "batch_idx": torch.arange(batch).repeat_interleave(objects).float(),
        "cls": torch.randint(0, nc, (len(cell), 1), generator=g).float(),
        "bboxes": torch.cat([centre, wh], 1),
    }


def _grid_masks(batch: int, size: int, objects: int, xywh: torch.Tensor, overlap: bool) -> dict:
    """Instance masks at ``size`` x ``size`` (the prototypes' resolution) filling each box, by broadcasting."""
    pixel = (torch.arange(size) + 0.5) / size
    lo, hi = xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2
    inside_x = (pixel >= lo[:, :1]) & (pixel < hi[:, :1])  # (n, size)
    inside_y = (pixel >= lo[:, 1:]) & (pixel < hi[:, 1:])
    inside = inside_y[:, :, None] & inside_x[:, None, :]  # (n, size, size)
    if overlap:
        index = torch.arange(1, objects + 1).repeat(batch)[:, None, None]
        dtype = torch.int32 if objects > 255 else torch.uint8
        masks = (inside * index).view(batch, objects, size, size).amax(1).to(dtype)
    else:
        masks = inside.float()
    return {"masks": masks, "sem_masks": torch.zeros(batch, size, size)}


class LayerAccounting:
    """Forward hooks on each layer that attribute output and saved-for-backward bytes to it, and on each module
    recomputed on its own below the layers (``yolo_ckpt.checkpointing.engine.sub_regions``) that attribute its layer's saved bytes
    to it too (``modules``: name -> [saved, freeable] bytes). With ``tracker`` set, also each layer's peak live bytes
    in its forward and in its backward (gradient hooks on its outputs, the last segment closed when the backward
    ends)."""

    def __init__(self, model):
        from ..checkpointing.engine import sub_regions

        self.rows = {i: [0, 0, 0] for i in range(len(model.model))}  # index -> [output, saved, freeable] bytes
        self.modules: dict[str, list[int]] = {}
        self._seen: set[int] = set()
        self._inputs: set[int] = set()
        # parameters and buffers live all step long (the static bytes): recomputation never frees them
        self._static = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
        self._stack: list = []
        self._active: list[tuple[str, set[int]]] = []  # the sub-modules whose forward runs: name, input storages
        self.tracker: LiveTensorTracker | None = None  # set it to measure each layer's forward and backward peak
        self.forward_peaks: dict[int, int] = {}
        self.backward_peaks: dict[int, int] = {}
        self._in_backward: int | None = None  # the layer whose backward runs now
        self._handles = []
        for i, layer in enumerate(model.model):
            self._handles.append(layer.register_forward_pre_hook(self._pre(i)))
            self._handles.append(layer.register_forward_hook(self._post(i), always_call=True))
        for name, module in (part for parts in sub_regions(model).values() for part in parts):
            self.modules[name] = [0, 0]
            self._handles.append(module.register_forward_pre_hook(self._enter(name)))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))

    def _enter(self, name):
        def hook(module, args):
            self._active.append((name, {t.untyped_storage()._cdata for t in tree_leaves(args) if isinstance(t, torch.Tensor)}))

        return hook

    def _leave(self, module, args, output) -> None:
        self._active.pop()

    def _pre(self, i):
        def hook(module, args):
            self._inputs = {t.untyped_storage()._cdata for t in tree_leaves(args) if isinstance(t, torch.Tensor)}
            if self.tracker is not None:
                self.tracker.mark()
            ctx = torch.autograd.graph.saved_tensors_hooks(self._pack(i), lambda t: t)
            ctx.__enter__()
            self._stack.append(ctx)

        return hook

    def _post(self, i):
        def hook(module, args, output):
            self._stack.pop().__exit__(None, None, None)
            outs = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tree_leaves(output) if isinstance(t, torch.Tensor)}
            self.rows[i][0] += sum(outs.values())
            if self.tracker is not None:
                self.forward_peaks[i] = self.tracker.mark()
            if self.tracker is not None and torch.is_grad_enabled():
                for t in tree_leaves(output):
                    if isinstance(t, torch.Tensor) and t.requires_grad:
                        t.register_hook(self._backward_reaches(i))

        return hook

    def _backward_reaches(self, i):
        """A gradient hook on layer i's outputs: its gradient is there, so its backward starts; the peak since the
        last mark was the previous layer's (or, before the first layer, the loss's)."""

        def hook(grad):
            peak = self.tracker.mark()
            if self._in_backward is None:  # the first layer reached: its backward and the rest end with the pass's
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_ends)
            else:
                self.backward_peaks[self._in_backward] = max(self.backward_peaks.get(self._in_backward, 0), peak)
            self._in_backward = i

        return hook

    def _backward_ends(self) -> None:
        peak = self.tracker.mark()
        self.backward_peaks[self._in_backward] = max(self.backward_peaks.get(self._in_backward, 0), peak)
        self._in_backward = None

    def _pack(self, i):
        def pack(t):
            key = t.untyped_storage()._cdata
            if key not in self._seen:
                self._seen.add(key)
                nbytes = t.untyped_storage().nbytes()
                self.rows[i][1] += nbytes
                if key not in self._inputs and key not in self._static:
                    self.rows[i][2] += nbytes
                for name, inputs in self._active:
                    self.modules[name][0] += nbytes
                    if key not in inputs and key not in self._static:
                        self.modules[name][1] += nbytes
            return t

        return pack

    def remove(self):
        for h in self._handles:
            h.remove()

    def profile_rows(self, model, flops: dict[str, int]) -> tuple[list[LayerRow], dict[str, ModuleRow]]:
        """The :class:`LayerRow` of each layer and the :class:`ModuleRow` of each sub-module of ``model`` (the model
        hooked), with ``flops`` from :func:`module_flops` (0 where absent)."""
        from ..checkpointing.engine import recompute_mode_of

        layers = [
            LayerRow(
                i, str(m.type).rsplit(".", 1)[-1], *self.rows[i], flops.get(str(i), 0), recompute_mode_of(m),
                self.forward_peaks.get(i, 0), self.backward_peaks.get(i, 0),
            )
            for i, m in enumerate(model.model)
        ]
        return layers, {name: ModuleRow(name, *row, flops.get(name, 0)) for name, row in self.modules.items()}


def module_flops(model, images: torch.Tensor) -> dict[str, int]:
    """Forward FLOPs on ``images`` of every module under ``model.model``, by qualified name there (``"6"``,
    ``"6.m.0.1"``, ``"23.cv2.0"``), from ``torch.utils.flop_counter`` (works on fake tensors too)."""
    with FlopCounterMode(display=False) as counter:
        model(images)
    prefix = f"{type(model).__name__}.model."
    return {k[len(prefix):]: int(sum(v.values())) for k, v in counter.get_flop_counts().items() if k.startswith(prefix)}


def layer_flops(model, images: torch.Tensor) -> list[int]:
    """Forward FLOPs of each layer of ``model.model`` on ``images`` (works on fake tensors too)."""
    counts = module_flops(model, images)
    return [counts.get(str(i), 0) for i in range(len(model.model))]


def run_step(model, batch, optimizer, loss_fn, tracker, autocast=None):
    """Forward, loss, backward, optimizer step; returns the per-phase peaks, the bytes alive before the loss and the
    optimizer state's bytes. ``autocast`` (a context manager) covers the forward and the loss, as in Ultralytics'
    training step.

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
    peaks["loss"] = tracker.phase_peak_bytes
    tracker.start_phase()
    loss.backward()
    del loss, preds
    peaks["backward"] = tracker.phase_peak_bytes
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


# Ultralytics' optimizer names (``BaseTrainer.build_optimizer``'s ``optimizers`` set), mirrored to check a name
# before any work starts; the optimizer itself is built by Ultralytics' builder.
OPTIMIZERS = ("Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSprop", "SGD", "MuSGD")


def optimizer_for(name: str = "auto", iterations: int = 0) -> str:
    """The optimizer Ultralytics builds for ``optimizer=name`` in a run of ``iterations`` optimizer steps
    (``ceil(len(dataset) / max(batch, nbs)) * epochs``): ``auto`` is AdamW up to 10000 iterations and MuSGD beyond
    (``BaseTrainer.build_optimizer``); other names are matched case-insensitively, as there.

    Raises:
        ValueError: naming ``name`` and the valid names (:data:`OPTIMIZERS` and ``auto``).
    """
    if str(name).lower() == "auto":
        return "MuSGD" if iterations > 10000 else "AdamW"
    names = {n.lower(): n for n in OPTIMIZERS}
    if str(name).lower() not in names:
        raise ConfigError(f"optimizer={name!r} is not an Ultralytics optimizer; valid: auto, {', '.join(OPTIMIZERS)}")
    return names[str(name).lower()]


def build_optimizer(model, name: str = "AdamW", iterations: int = 0):
    """The optimizer Ultralytics trains ``model`` with, built by Ultralytics' own ``BaseTrainer.build_optimizer``
    (called on a stand-in trainer holding the default hyperparameters): its parameter groups, and so its state
    (AdamW, Adam: 2 tensors per parameter and a step; SGD: 1; RMSprop with momentum: 2; MuSGD: 2 for
    matrices and conv filters, 1 for the rest; none for parameters that do not require grad), are the run's. The
    state exists once a step has run.

    Args:
        model: the module whose parameters it optimizes (real or fake tensors).
        name, iterations: as in :func:`optimizer_for` (``auto`` resolved there).

    Raises:
        ValueError: for a name Ultralytics does not know.
    """
    from types import SimpleNamespace

    from ultralytics.cfg import DEFAULT_CFG
    from ultralytics.engine.trainer import BaseTrainer

    name = optimizer_for(name, iterations)
    trainer = SimpleNamespace(args=SimpleNamespace(**vars(DEFAULT_CFG)), data={})
    logger = logging.getLogger("ultralytics")
    level = logger.level
    logger.setLevel(logging.WARNING)  # its per-build summary line, once per estimate, is noise here
    try:
        return BaseTrainer.build_optimizer(trainer, model, name, DEFAULT_CFG.lr0, DEFAULT_CFG.momentum, DEFAULT_CFG.weight_decay)
    finally:
        logger.setLevel(level)


def autocast_for(amp: bool, device_type: str):
    """The forward's and loss's autocast for ``amp=``: fp16 on CUDA, as Ultralytics trains; elsewhere (where
    Ultralytics turns AMP off) bf16, CPU autocast's 2-byte type; or a no-op."""
    if not amp:
        return contextlib.nullcontext
    dtype = torch.float16 if device_type == "cuda" else torch.bfloat16
    return lambda: torch.autocast(device_type, dtype=dtype)


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
) -> StepProfile:
    """Measure one real training step of a copy of ``model``: forward and loss (under autocast for ``amp``),
    backward, optimizer step; per phase and per layer. The one step-measurement harness, any task, any device.

    On CUDA the peaks come from the allocator (``max_memory_allocated``), less what was on the device before the
    copy was made (the live model, other tensors), plus the batch; elsewhere from :class:`LiveTensorTracker`. The
    optimizer is built by :func:`build_optimizer` and its state counted all step long, as in every step after the
    first (:func:`run_step`). Not modelled: ``GradScaler``'s loss scaling (a few scalars), DDP buckets. The live model,
    its BatchNorm statistics and the RNG are untouched.

    Args:
        model: an Ultralytics ``BaseModel`` of a task in :data:`TASKS`, with ``.args`` set.
        batch: a preprocessed training batch (:func:`training_batch`), on the model's device.
        recompute, mode: the policy (``yolo_ckpt.checkpointing.policy``) and ``recompute_mode`` to apply to the copy; ``None``
            keeps what is applied to ``model`` (a ``deepcopy`` keeps it).
        optimizer: an Ultralytics optimizer name (:func:`build_optimizer`), ``auto`` meaning AdamW.
        amp: autocast the forward and loss (:func:`autocast_for`).
        flops: count per-layer forward FLOPs (one more forward pass); 0 when False.
        loss_chunk, assign_chunk: the loss region's chunks where ``recompute`` applies it
            (:func:`yolo_ckpt.checkpointing.engine.apply_checkpointing`); None: their defaults.

    Returns:
        The :class:`StepProfile` (``source`` says which counter; ``recompute`` the layers recomputed).
    """
    from ..checkpointing.engine import apply_checkpointing, checkpointed_layers

    cuda = batch["img"].device.type == "cuda"
    before = torch.cuda.memory_allocated() if cuda else 0
    probe = copy.deepcopy(model).train()
    spec = ",".join(map(str, checkpointed_layers(probe))) or "none"
    if recompute is not None:
        spec = apply_checkpointing(probe, recompute, mode=mode, loss_chunk=loss_chunk, assign_chunk=assign_chunk).spec
    opt = build_optimizer(probe, optimizer)
    flop_counts = module_flops(probe, batch["img"]) if flops else {}
    autocast = autocast_for(amp, batch["img"].device.type)

    def loss_fn(preds):
        return probe.loss(batch, preds)[0].sum()

    accounting = LayerAccounting(probe)
    try:
        with torch.random.fork_rng(devices=[batch["img"].device] if cuda else []):
            if cuda:
                offset = tensor_bytes(batch) - before
                counter = _Allocator()
                static = counter.start_phase() + offset
                peaks, before_loss, state = run_step(probe, batch, opt, loss_fn, counter, autocast)
                peaks = {k: v + offset for k, v in peaks.items()}
                before_loss += offset
            else:
                with LiveTensorTracker() as tracker:
                    tracker.track(list(probe.parameters()), list(probe.buffers()), batch)
                    static = tracker.live_bytes
                    peaks, before_loss, state = run_step(probe, batch, opt, loss_fn, tracker, autocast)
    finally:
        accounting.remove()
    rows, modules = accounting.profile_rows(probe, flop_counts)
    return StepProfile(
        source="cuda_allocator" if cuda else "cpu_live_tensors",
        recompute=spec,
        mode=mode,
        batch=len(batch["img"]),
        imgsz=batch["img"].shape[-1],
        objects=int(len(batch["batch_idx"]) // max(len(batch["img"]), 1)) if "batch_idx" in batch else 0,
        static_bytes=static + state,
        phase_peak_bytes=peaks,
        loss_bytes=peaks["loss"] - before_loss,
        peak_bytes=max(peaks.values()),
        layers=rows,
        input_bytes=tensor_bytes(batch),
        modules=modules,
    )


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of these tensors (nested lists/dicts allowed)."""
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)}
    return sum(storages.values())


class _Allocator:
    """The CUDA caching allocator as :func:`run_step`'s counter (``live_bytes``, ``phase_peak_bytes``)."""

    live_bytes = property(lambda self: torch.cuda.memory_allocated())
    phase_peak_bytes = property(lambda self: torch.cuda.max_memory_allocated())

    def start_phase(self) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
