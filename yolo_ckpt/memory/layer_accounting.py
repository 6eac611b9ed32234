"""Per-layer accounting of a training step: what each layer of ``model.model``, and each module below the layers that
is recomputed on its own, outputs, saves for backward, frees when recomputed and costs in forward FLOPs, and each
layer's peak live bytes in its forward and its backward. :class:`LayerAccounting` hooks a model (real or fake
tensors) for one step; its rows (:class:`LayerRow`, :class:`ModuleRow`) are what the planner composes
(:class:`yolo_ckpt.memory.memory_model.MemoryModel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from ..checkpointing.attention import every_step
from ..checkpointing.engine import apply_checkpointing
from .fake_copy import fake_copy
from .synthetic_batch import training_batch
from .tracker import LiveTensorTracker


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

    @property
    def in_backward(self) -> int | None:
        """With ``tracker`` set, the index of the layer whose backward runs now (from its outputs' gradients to the
        next layer's); None outside the backward pass."""
        return self._in_backward

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


def stand_in_loss(preds) -> torch.Tensor:
    """A scalar whose backward gives each tensor of ``preds`` (a model's predictions: a tensor or a nest of them) a
    dense gradient of its shape and dtype, as the real loss does, and that saves nothing of them for the backward (a
    scalar factor), so they are freed as soon as the caller drops them, as Ultralytics' ``model.loss`` drops them;
    what the real loss saves is the loss model's (:mod:`yolo_ckpt.memory.loss_model`). The fake passes'
    (:func:`~yolo_ckpt.memory.estimate.estimate_step`) and :func:`step_flops`' loss."""
    return sum((t.float() * 2.0).sum() for t in tree_leaves(preds) if isinstance(t, torch.Tensor))


def layer_flops(model, images: torch.Tensor) -> list[int]:
    """Forward FLOPs of each layer of ``model.model`` on ``images`` (works on fake tensors too)."""
    counts = module_flops(model, images)
    return [counts.get(str(i), 0) for i in range(len(model.model))]


def step_flops(model, imgsz: int, batch: int, recompute="none", mode: str = "full", attn_chunk: int | None = None) -> int:
    """FLOPs of one training step's forward and backward with ``recompute`` applied, as it runs: the recomputed
    forwards and the attention region's rebuilt products included. Counted by ``torch.utils.flop_counter`` (matrix
    products and convolutions, not elementwise work) on a fake copy (:func:`~yolo_ckpt.memory.fake_copy.fake_copy`:
    nothing computed, ``model`` untouched), with :func:`stand_in_loss`: the real loss's few products are not counted. A separate
    pass: the flop counter's module hooks keep recomputed tensors alive, so a measured step counted at once would hold
    more than it does.

    Args:
        model: an Ultralytics ``BaseModel`` (real parameters), with ``.args`` set. imgsz: a trained size (px, a
            multiple of the model's largest stride). batch: images per step.
        recompute, mode, attn_chunk: the policy, ``recompute_mode`` and attention chunk
            (:func:`yolo_ckpt.checkpointing.engine.apply_checkpointing`).

    Returns:
        FLOPs (an int).
    """
    with fake_copy(model) as (fake_mode, fake), every_step():  # every chunk of the attention region runs: its products count
        apply_checkpointing(fake, recompute, mode=mode, attn_chunk=attn_chunk)
        with fake_mode:
            images = training_batch(model, batch, imgsz, 1)["img"]
            with FlopCounterMode(display=False) as counter:
                stand_in_loss(fake(images)).backward()
    return counter.get_total_flops()
