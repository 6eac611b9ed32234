"""Compose a training step's peak for any set of recomputed units, batch and imgsz from one fake pass.

A unit is what a plan recomputes or not: a layer of ``model.model`` (a nested layer with its inner blocks one at a
time, :data:`yolo_ckpt.checkpointing.engine.NESTED_BLOCKS`), ``head`` (the final head's branches) and, for detect,
obb, pose and segment models (:data:`yolo_ckpt.checkpointing.policy.LOSS_HEADS`), ``loss`` (the loss region,
:mod:`yolo_ckpt.checkpointing.losses`: the chunked assigner and the segmentation mask loss) and, for models with
attention layers, ``attention`` (:mod:`yolo_ckpt.checkpointing.attention`: chunks of ``attn_chunk`` queries).
:class:`ComposedEstimate` composes the per-layer and per-module figures of one fake-tensor estimate of
``recompute=none`` (:func:`yolo_ckpt.memory.estimate.estimate_step`) instead of running a fake pass per candidate:

- recomputing a layer or the head's branches frees what their forward saved for backward, less their inputs,
  which the checkpoint keeps, and the parameters (outputs kept anyway for skip connections are attributed to the
  layer that saves them, so they are never counted as freed twice);
- a recomputed layer whose region takes in parameter-free layers (``Upsample``, ``Concat``:
  :func:`yolo_ckpt.checkpointing.engine.folded_layers`) frees their output, its input, too (rebuilt in its backward
  and, for a while, in its forward), and keeps their inputs instead: those that nothing else keeps then are added
  (:meth:`ComposedEstimate._fold_terms`);
- the fake pass measures, per layer, the peak live bytes while its forward ran and while its backward ran
  (:class:`yolo_ckpt.memory.layer_accounting.LayerRow`); in layer i's forward or backward the recomputed units before
  it hold only their inputs, and a recomputed unit i itself holds its freed tensors again, a nested layer one inner
  block at a time and the head one branch at a time;
- the loss's forward and backward peaks are a formula (:class:`yolo_ckpt.memory.loss_model.LossModel`), the stock
  loss's or, with ``loss``, the loss region's, calibrated with the region applied in ``loss_chunk`` anchors and
  ``assign_chunk`` objects per chunk;
- activations and the training batch scale with batch x imgsz^2, stock attention's N x N matrices with
  batch x imgsz^4 (split from the rest by fake passes at a reference imgsz, :meth:`ComposedEstimate._split_attention_terms`;
  with ``attention`` on, its chunks' N x attn_chunk with batch x imgsz^2), the loss by its own formula, parameters
  and optimizer state not at all;
- an imgsz is planned at the size it trains at (:func:`yolo_ckpt.memory.ultralytics_rules.train_imgsz`: 2736 -> 2752).

In the tests (``tests/memory/test_memory_model.py``) the composed peak equals the fake pass's of the same policy for
layer sets and the loss region, and is up to 2.5% below it where the head's branches are recomputed (the head holds a
little more than its largest branch); the planner's own fake pass (:meth:`ComposedEstimate.estimate`) catches that.
That fake pass of any policy is kept per units, batch and imgsz, in the process and across processes
(:mod:`yolo_ckpt.memory.estimate_cache`). The planner's search over these figures is
:class:`yolo_ckpt.memory.memory_model.MemoryModel`.
"""

from __future__ import annotations

import dataclasses

from ..checkpointing.chunks import DEFAULT_ATTN_CHUNK, check_attn_chunk
from ..checkpointing.engine import folded_layers, layer_inputs, sub_regions
from ..checkpointing.policy import REGIONS, ModelLayout, RecomputePolicy, check_mode, resolve, spec_string
from . import estimate_cache
from .attention_shapes import attention_modules
from .estimate import estimate_step, with_loss_phases
from .loss_calibration import loss_models
from .step import StepProfile
from .ultralytics_rules import train_imgsz


def _cached_step(key: tuple, compute) -> StepProfile:
    """``compute()``'s fake pass, or an earlier process's of the same ``key`` (:mod:`yolo_ckpt.memory.estimate_cache`)."""
    stored = estimate_cache.load("step", key)
    if stored is not None:
        return StepProfile.from_dict(stored)
    step = compute()
    estimate_cache.store("step", key, dataclasses.asdict(step))
    return step


def _without_flops(step: StepProfile) -> StepProfile:
    """``step`` with its layers' and modules' forward FLOPs 0 (a pass with ``flops=False``)."""
    return dataclasses.replace(
        step,
        layers=[dataclasses.replace(r, forward_flops=0) for r in step.layers],
        modules={name: dataclasses.replace(r, forward_flops=0) for name, r in step.modules.items()},
    )


class ComposedEstimate:
    """Per-unit figures of one ``recompute=none`` estimate, composed for any set of units, batch and imgsz; and the
    fake pass of any policy, cached.

    A unit is a layer index (a nested layer, :data:`yolo_ckpt.checkpointing.engine.NESTED_BLOCKS`, with its inner
    blocks), ``"head"`` (the final head's branches), where the head has a loss region
    (:data:`yolo_ckpt.checkpointing.policy.LOSS_HEADS`), ``"loss"`` and, where the model has attention layers,
    ``"attention"``. Per unit, from the fake pass's per-layer and
    per-module accounting (:class:`yolo_ckpt.memory.layer_accounting.LayerRow`,
    :class:`yolo_ckpt.memory.layer_accounting.ModuleRow`):

    - a layer frees its ``freeable_bytes`` and holds them again while it runs (its inputs and parameters stay
      alive); a nested layer holds them less what its inner blocks free, plus what its largest inner block frees
      (the blocks run one at a time inside the layer's recomputation);
    - ``head`` frees what its branches free and holds again what the largest branch frees;
    - these are composed with the per-layer forward and backward peaks of the ``none`` pass (module docstring);
    - ``loss`` swaps the loss's forward and backward peaks for those of the loss-region formula (calibrated with the
      region applied, in ``loss_chunk`` anchors per chunk);
    - ``attention`` swaps each layer's peaks for those of the region's pass at the reference imgsz, and stops the
      attention layers' saved N x N softmax (:meth:`_split_attention_terms`); where no module has more tokens than
      ``attn_chunk`` the region runs stock's product and changes nothing.

    Recompute cost (forward FLOPs recomputed per step): a layer's or the head branches' forward FLOPs
    (``torch.utils.flop_counter``); the loss region's, :meth:`loss_flops`; the attention region's, :meth:`attention_flops`.

    Args:
        model: an Ultralytics ``BaseModel`` of any task in :data:`yolo_ckpt.memory.ultralytics_rules.TASKS`, with
            ``.args`` set (a policy applied to it is ignored: its figures are of the stock model).
        imgsz, batch, objects: the step to base the figures on (activations are rescaled from it); ``imgsz`` as
            ``imgsz=`` takes it (int, list, string), here and in every method: the size that trains is planned.
        optimizer, amp: as in :func:`yolo_ckpt.memory.estimate.estimate_step`.
        loss_chunk: anchors per forward chunk of the loss region's mask loss (``loss_chunk=``); None: its default.
        assign_chunk: objects per chunk of the loss region's assigner (``assign_chunk=``); None: its default.
        sizes: the training set's :class:`~yolo_ckpt.memory.foreground.ObjectSizes` (the loss's foreground anchors
            bounded by its boxes' sizes); None: the worst size, ``objects * topk`` anchors per image.
        attn_chunk: queries (and keys) per chunk of the attention region (``attn_chunk=``); None: its default.
        mode: ``recompute_mode=`` of every fake pass of a policy (:meth:`estimate`), ``"full"`` or ``"selective"``
            (which keeps the convolutions' outputs: it frees less). The per-unit figures are of full recomputation,
            so under ``"selective"`` the composed peaks are a lower bound that only guides the planner's search;
            every answer it gives is a fake pass's of the mode, and the recompute FLOPs are full recomputation's
            (an upper bound).

    Raises:
        ValueError: for a bad ``loss_chunk`` or ``assign_chunk`` (:class:`yolo_ckpt.errors.ConfigError` for a bad
            ``attn_chunk``), and as
            :func:`yolo_ckpt.memory.estimate.estimate_step` raises.
    """

    def __init__(
        self, model, imgsz, batch: int, objects: int = 20, optimizer: str = "AdamW", amp: bool = False,
        loss_chunk: int | None = None, assign_chunk: int | None = None, sizes=None, attn_chunk: int | None = None,
        mode: str = "full",
    ):
        self.attn_chunk = check_attn_chunk(DEFAULT_ATTN_CHUNK if attn_chunk is None else attn_chunk)
        check_mode(mode)
        self.mode = mode
        self.model, self.objects, self.optimizer, self.amp = model, objects, optimizer, amp
        self.sizes = sizes
        self.layout = ModelLayout.from_model(model)
        self.loss_models = loss_models(model, amp, loss_chunk, assign_chunk)
        # The fake pass without the loss's share (a formula of zeros): the loss's peaks are composed per unit below.
        zeros = (0.0,) * len(self.loss_models[False].forward)
        self._no_loss = no_loss = dataclasses.replace(self.loss_models[False], forward=zeros, backward=zeros, pair_bytes=0.0, kept=0)
        self._key = (estimate_cache.model_key(model), objects, optimizer, amp)
        self._base_key = (*self._key, "base", batch, train_imgsz(imgsz, model.stride), repr(no_loss))
        self.base = _cached_step(
            self._base_key, lambda: estimate_step(model, imgsz, batch, objects, "none", optimizer=optimizer, amp=amp, loss_model=no_loss)
        )
        self.candidates = self.units("all")  # the layers, then "head" and, where there is one, "loss"
        self.strides = model.stride.tolist()
        rows, modules, parts = self.base.layers, self.base.modules, sub_regions(model)
        self.freed, self.rebuilt, self.flops = {}, {}, {}
        for i in (u for u in self.candidates if not isinstance(u, str)):
            blocks = [modules[name] for name, _ in parts[i]]
            self.freed[i], self.flops[i] = rows[i].freeable_bytes, rows[i].forward_flops
            # a nested layer's recomputation holds its own saved tensors and one inner block's at a time
            self.rebuilt[i] = (
                rows[i].freeable_bytes - sum(b.freeable_bytes for b in blocks) + max((b.freeable_bytes for b in blocks), default=0)
            )
        branches = [modules[name] for name, _ in parts[self.layout.head]]
        self.freed["head"] = sum(b.freeable_bytes for b in branches)
        self.rebuilt["head"] = max((b.freeable_bytes for b in branches), default=0)
        self.flops["head"] = sum(b.forward_flops for b in branches)
        self.step_flops = 3 * sum(r.forward_flops for r in rows)  # backward costs about twice the forward
        # estimate()'s fake passes, by units but the loss region, batch and imgsz; the base pass is none's at its own
        # batch and imgsz (its optimizer step run, as optimizer_from reproduces it; its FLOPs dropped, as estimate's have none)
        self._passes: dict[tuple, StepProfile] = {((), self.base.batch, self.base.imgsz): _without_flops(self.base)}
        self.attention = attention_modules(model) if "attention" in self.candidates else ()
        # for the fold of parameter-free layers into the recomputed region after them (_fold_terms): each layer's
        # inputs, and the first layer with a trainable parameter that takes each output (its forward saves it)
        layers = model.model
        self._layer_inputs = {i: layer_inputs(layers, i) for i in range(len(layers))}
        trainable = [i for i, m in enumerate(layers) if any(p.requires_grad for p in m.parameters())]
        self._first_saver = {k: next((i for i in trainable if k in self._layer_inputs[i]), None) for k in range(len(layers))}
        self._saved_list = set(model.save)
        self._split_attention_terms()

    def _split_attention_terms(self) -> None:
        """Split the base pass's per-layer forward and backward peaks (above the static bytes) and its held bytes at the
        loss into a term that grows with batch x imgsz^2 (``_lin``) and one with batch x imgsz^4 (``_quad``: stock's
        N x N matrices), and give what they are with the attention region on (``_on``, all batch x imgsz^2: its
        chunks hold N x chunk); per layer the saved N x N bytes a recomputed layer frees (``_saved_quad``); and per
        attention layer what its recomputation holds beyond that composition (``_rebuilt_quad``, by batch x imgsz^4).

        Measured, not assumed: three more fake passes at a reference imgsz ``s`` (at least 1.5x the base's, and where
        every module has more tokens than ``attn_chunk``, so the region runs its chunks): ``none`` there gives, per
        layer, ``P(s) = r2 lin + r4 quad`` against the base's ``P = lin + quad`` (``r2 = (s / base)^2``, ``r4 = r2^2``);
        ``attention`` there gives the region's peaks, ``/ r2``; the attention layers recomputed there, their rebuild.
        A layer's peak is the largest of several moments: the split is exact at the two sizes, close between and
        near them, an approximation far above (which moment is largest changes). Layers before the first attention layer, and models
        without one, keep the base pass's peaks as they are (``_quad`` 0, ``_on`` = ``_lin``)."""
        base, rows = self.base, self.base.layers
        peaks = {("f", r.index): r.forward_peak_bytes - base.static_bytes for r in rows}
        peaks |= {("b", r.index): r.backward_peak_bytes - base.static_bytes for r in rows}
        peaks["end"] = base.phase_peak_bytes["loss"] - base.loss_bytes - base.static_bytes
        self._lin, self._quad, self._on = dict(peaks), dict.fromkeys(peaks, 0.0), dict(peaks)
        self._saved_quad = dict.fromkeys(range(len(rows)), 0.0)
        self._rebuilt_quad: dict = {}
        self.attention_imgsz = None
        if not self.attention:
            return
        grid = int(max(self.strides))
        # the smallest multiple of the grid at which every module's tokens exceed the chunk, and at least 1.5x the base
        least = max(int(a.stride * (a.groups * (self.attn_chunk + 1)) ** 0.5) + 1 for a in self.attention)
        s = self.attention_imgsz = -(-max(least, 3 * base.imgsz // 2) // grid) * grid
        off, on = self._pass((), base.batch, s), self._pass(("attention",), base.batch, s)
        r2 = (s / base.imgsz) ** 2
        first = min(a.index for a in self.attention)

        def above_static(step):
            out = {("f", r.index): r.forward_peak_bytes - step.static_bytes for r in step.layers}
            out |= {("b", r.index): r.backward_peak_bytes - step.static_bytes for r in step.layers}
            out["end"] = step.phase_peak_bytes["loss"] - step.loss_bytes - step.static_bytes
            return out

        p_off, p_on = above_static(off), above_static(on)
        for key, p in peaks.items():
            if key != "end" and key[1] < first:
                continue
            quad = max((p_off[key] - r2 * p) / (r2 * r2 - r2), 0.0)
            self._lin[key], self._quad[key], self._on[key] = p - quad, quad, p_on[key] / r2
        layers = sorted({a.index for a in self.attention})
        for a in layers:  # the N x N softmax stock saves and the region does not
            self._saved_quad[a] = max(off.layers[a].saved_bytes - on.layers[a].saved_bytes, 0) / (r2 * r2)
        # a recomputed attention layer's backward runs its forward again: more N x N bytes at once than the none pass
        # held there, measured by a third pass recomputing the attention layers (what this composition lacks there)
        rebuilt, composed = above_static(self._pass(tuple(layers), base.batch, s)), self._held(layers, base.batch, s)[0]
        self._rebuilt_quad = {(ph, a): max(rebuilt[ph, a] - composed[ph, a], 0.0) / (r2 * r2) for ph in "fb" for a in layers}

    def _pass(self, units: tuple, batch: int, imgsz: int) -> StepProfile:
        """The fake pass of ``units`` (not ``"loss"``) at this batch and trained imgsz, in this estimate's ``mode``,
        without the loss's share, kept per units, batch and imgsz (:meth:`estimate`)."""
        key = (units, batch, imgsz)
        if key not in self._passes:
            self._passes[key] = _cached_step((*self._key, *key, repr(self._no_loss), self.attn_chunk, self.mode), lambda: estimate_step(
                self.model, imgsz, batch, self.objects, self.spec(units), self.mode, optimizer=self.optimizer, amp=self.amp,
                loss_model=self._no_loss, flops=False, optimizer_from=self.base, attn_chunk=self.attn_chunk,
            ))
        return self._passes[key]

    def passed(self, recompute) -> list[tuple[int, int]]:
        """The (batch, trained imgsz) of every fake pass this estimate holds whose figures :meth:`estimate` of
        ``recompute`` reuses (one of its units but ``"loss"``): what a search for the largest batch or imgsz knows
        before it makes a pass (:meth:`yolo_ckpt.memory.memory_model.MemoryModel.largest_batch`)."""
        units = tuple(u for u in self.units(recompute) if u != "loss")
        return [(batch, imgsz) for (held, batch, imgsz) in self._passes if held == units]

    def attention_on(self, units, imgsz: int) -> bool:
        """Whether ``units`` bound attention at this trained imgsz: ``"attention"`` among them and a module with more
        tokens than ``attn_chunk`` (fewer run stock's product)."""
        return "attention" in units and any(a.tokens(imgsz) > self.attn_chunk for a in self.attention)

    def attention_flops(self, batch: int, imgsz) -> int:
        """FLOPs the attention region adds per step: its backward rebuilds each chunked module's scores twice and the
        output gradient's product with the values once more
        (:meth:`~yolo_ckpt.memory.attention_shapes.AttentionShape.recompute_flops`); 0 where no module is chunked."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        return sum(a.recompute_flops(batch, imgsz) for a in self.attention if a.tokens(imgsz) > self.attn_chunk)

    def units(self, recompute) -> tuple:
        """The units of a ``recompute=`` value or a :class:`~yolo_ckpt.checkpointing.policy.RecomputePolicy`: its layer indices,
        then ``"head"`` and ``"loss"`` where it recomputes them (``"all"`` -> every candidate).

        Raises:
            ValueError: as :func:`yolo_ckpt.checkpointing.policy.resolve` raises for a bad value.
        """
        policy = recompute if isinstance(recompute, RecomputePolicy) else resolve(recompute, self.layout)
        return (*policy.indices, *policy.regions())

    @staticmethod
    def regions(units) -> tuple[str, ...]:
        """The regions among ``units``, in :data:`yolo_ckpt.checkpointing.policy.REGIONS` order."""
        return tuple(r for r in REGIONS if r in units)

    @staticmethod
    def spec(units) -> str:
        """``units`` as a ``recompute=`` value: ``(6, 2, "loss", "head")`` -> ``"2,6,head,loss"``; ``()`` -> ``"none"``."""
        layers = sorted(u for u in units if not isinstance(u, str))
        return ",".join([*map(str, layers), *ComposedEstimate.regions(units)]) or "none"

    def _static_bytes(self, k: float) -> float:
        """Bytes alive all step long at ``k`` times the base pass's batch x pixels: its static bytes, the batch scaled."""
        return self.base.static_bytes + (k - 1) * self.base.input_bytes

    def scale(self, batch: int, imgsz: int) -> float:
        """How many times the base pass's batch x pixels a step of ``batch`` at the trained ``imgsz`` holds: the factor
        activations, the batch and layer FLOPs grow by."""
        return batch * imgsz**2 / (self.base.batch * self.base.imgsz**2)

    def freed_bytes(self, unit, batch: int, imgsz: int) -> float:
        """Bytes recomputing ``unit`` alone takes off a step at this batch and trained ``imgsz``: a layer's or the
        head's freed bytes, scaled; the loss region's, how much lower its loss peaks are than the stock loss's; the
        attention region's, how much lower the composed peak is (stock's N x N matrices grow faster than any layer's
        bytes)."""
        if unit == "attention":
            return self.peak((), batch, imgsz) - self.peak(("attention",), batch, imgsz)
        if unit == "loss":
            return max(self._loss_peaks(False, batch, imgsz)[:2]) - max(self._loss_peaks(True, batch, imgsz)[:2])
        return self.scale(batch, imgsz) * self.freed[unit]

    def loss_flops(self, batch: int, imgsz) -> int:
        """Forward FLOPs the loss region recomputes per step: each image's predicted masks (foreground anchors x
        32 coefficients x prototype pixels, 2 FLOPs a product) twice, once per backward product's tiling
        (``yolo_ckpt.checkpointing.losses._MaskLoss.backward``): ``4 * nm * Fb * (imgsz / 4)^2``, with ``Fb`` the loss formula's
        bound on the batch's foreground anchors and ``nm`` the head's mask coefficients; 0 without a mask loss (the
        chunked assigner recomputes nothing)."""
        if True not in self.loss_models or not self.layout.has_mask_loss:
            return 0
        imgsz = train_imgsz(imgsz, self.model.stride)
        batch_foreground, _ = self.loss_models[True].foreground(batch, imgsz, self.objects, self.sizes)
        return 4 * int(self.model.model[-1].nm) * batch_foreground * (imgsz // 4) ** 2

    def cost(self, units, batch: int, imgsz) -> int:
        """Forward FLOPs recomputed per step by ``units`` at this batch and imgsz (the loss region's,
        :meth:`loss_flops`; the attention region's, :meth:`attention_flops`)."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        k = self.scale(batch, imgsz)
        return (
            int(k * sum(self.flops[u] for u in units if u not in ("loss", "attention")))
            + (self.loss_flops(batch, imgsz) if "loss" in units else 0)
            + (self.attention_flops(batch, imgsz) if "attention" in units else 0)
        )

    def flops_of(self, recompute) -> int:
        """Forward FLOPs recomputed per step by a ``recompute=`` value (at the base batch and imgsz)."""
        return self.cost(self.units(recompute), self.base.batch, self.base.imgsz)

    def _loss_peaks(self, loss: bool, batch: int, imgsz: int) -> tuple[int, int, int]:
        model = self.loss_models[loss]
        return (
            model.forward_bytes(batch, imgsz, self.objects, self.sizes), model.backward_bytes(batch, imgsz, self.objects, self.sizes),
            model.kept,
        )

    def peak(self, units, batch: int, imgsz) -> int:
        """Composed peak bytes of a step recomputing ``units`` (layer indices, ``"head"``, ``"loss"``) at this
        batch and imgsz: the largest of its :meth:`phase_peaks`."""
        return max(self.phase_peaks(units, batch, imgsz).values())

    def phase_peaks(self, units, batch: int, imgsz) -> dict[str, int]:
        """Composed peak bytes inside each phase (``forward``, ``loss``, ``backward``, ``optimizer``) of a step
        recomputing ``units`` at this batch and imgsz, static bytes included."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        k = self.scale(batch, imgsz)
        held, freed = self._held(units, batch, imgsz)
        loss, loss_backward, kept = self._loss_peaks("loss" in units, batch, imgsz)
        above_static = {
            "forward": max(v for key, v in held.items() if key[0] == "f"),
            "loss": held["end"] - freed + max(loss, loss_backward),
            "backward": max(v for key, v in held.items() if key[0] == "b"),
            "optimizer": self.base.phase_peak_bytes["optimizer"] - self.base.static_bytes,
        }
        return {phase: int(self._static_bytes(k) + kept + bytes_) for phase, bytes_ in above_static.items()}

    def _held(self, units, batch: int, imgsz: int) -> tuple[dict, float]:
        """Bytes above the static ones held at each layer's forward (``("f", i)``) and backward (``("b", i)``) peak and
        at the loss (``"end"``, before what the recomputed units free) of a step recomputing ``units``, and what they
        free; ``imgsz`` trained."""
        base, k = self.base, self.scale(batch, imgsz)
        k4 = k * imgsz**2 / base.imgsz**2  # batch x imgsz^4: stock's N x N matrices
        layers = {self.layout.head if u == "head" else u: u for u in units if u not in ("loss", "attention")}  # index -> unit
        on = self.attention_on(units, imgsz)

        def grown(key) -> float:  # a peak of the base pass, above the static bytes, at this batch and imgsz
            return k * self._on[key] if on else k * self._lin[key] + k4 * self._quad[key]

        def freed(u) -> float:  # what recomputing u frees: its N x N softmax grows with k4, and is not saved with the region on
            quad = self._saved_quad[u] if isinstance(u, int) else 0.0
            return k * (self.freed[u] - quad) + (0.0 if on else k4 * quad)

        # In the backward of layer i the none pass held what the layers before it saved: a recomputed one among them
        # holds only its inputs; a recomputed layer i itself rebuilds its freed bytes (a nested one block at a time),
        # and a recomputed stock attention layer its N x N matrices beyond the none pass's (``_rebuilt_quad``).
        # The same in its forward (a recomputed layer's runs whole, a nested one's or the head's a block at a time).
        direct, kept = self._fold_terms(units)

        def held(key) -> float:
            i = key[1]
            before = sum(freed(u) + k * direct.get(j, 0) for j, u in layers.items() if j < i)
            kept_now = k * sum(kept(source, key) for source in range(len(self.base.layers)))
            if i not in layers:
                return grown(key) - before + kept_now
            rebuilt_quad = 0.0 if on else k4 * self._rebuilt_quad.get(key, 0.0)
            # a region with folded layers rebuilds their output in its forward too (beside the one passed to it)
            rebuilding = k * direct.get(i, 0) if key[0] == "f" else 0.0
            return grown(key) - before - k * (self.freed[layers[i]] - self.rebuilt[layers[i]]) + rebuilt_quad + kept_now + rebuilding

        out = {key: held(key) for key in self._lin if key != "end"}
        out["end"] = grown("end") + k * sum(kept(source, "end") for source in range(len(self.base.layers)))
        return out, sum(freed(u) + k * direct.get(j, 0) for j, u in layers.items())

    def _fold_terms(self, units) -> tuple[dict, object]:
        """The fold of parameter-free layers into the recomputed regions of ``units``
        (:func:`yolo_ckpt.checkpointing.engine.folded_layers`), at the base pass's batch and imgsz: ``direct``, per
        recomputed layer, the bytes of the folded outputs it takes (its input, saved by its first convolution: the
        region frees them, and rebuilds them in its backward) and ``kept(source, key)``, the bytes of layer
        ``source``'s output a region keeps at the moment ``key`` that nothing else keeps then. A region keeps its inputs
        from its forward to the end of its backward: backward moments ``("b", i)`` with ``i >= c``, forward moments
        after ``c`` and the loss (``"end"``); the ``none`` pass keeps an output where a layer with a trainable parameter
        takes it (its forward saves it, until its backward: ``i >= `` that layer) and, in the forward, where
        ``model.save`` holds it for a later layer."""
        folded = folded_layers(self.model, {u for u in units if not isinstance(u, str)})
        outputs = [r.output_bytes for r in self.base.layers]
        direct: dict[int, int] = {}
        region_of: dict[int, int] = {}  # source -> the first region (lowest index) that keeps it
        for j, c in folded.items():
            if j in self._layer_inputs[c]:
                direct[c] = direct.get(c, 0) + outputs[j]
            for source in self._layer_inputs[j]:
                if source not in folded:
                    region_of[source] = min(region_of.get(source, c), c)

        def kept(source: int, key) -> int:
            c, saver = region_of.get(source), self._first_saver[source]
            if c is None:
                return 0
            if key == "end":
                return outputs[source] if saver is None else 0
            phase, i = key
            if phase == "b":
                return outputs[source] if i >= c and (saver is None or i < saver) else 0
            return outputs[source] if i > c and source not in self._saved_list and (saver is None or saver >= i) else 0

        return direct, kept

    def step(self, units, batch: int, imgsz) -> StepProfile:
        """The composed step of ``units`` at this batch and imgsz as a :class:`~yolo_ckpt.memory.step.StepProfile`
        (source ``"composed_estimate"``, no fake pass): its :meth:`phase_peaks` and peak, the static and batch bytes,
        the loss formula's share, and the layer rows of the ``recompute=none`` base pass with their bytes and FLOPs
        scaled to this batch and imgsz (what each layer saves when it is kept; per-layer peaks 0: not composed)."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        base, k = self.base, self.scale(batch, imgsz)
        phases = self.phase_peaks(units, batch, imgsz)
        forward, backward, kept = self._loss_peaks("loss" in units, batch, imgsz)
        scaled = [
            dataclasses.replace(
                r, output_bytes=int(k * r.output_bytes), saved_bytes=int(k * r.saved_bytes), freeable_bytes=int(k * r.freeable_bytes),
                forward_flops=int(k * r.forward_flops), forward_peak_bytes=0, backward_peak_bytes=0,
            )
            for r in base.layers
        ]
        return StepProfile(
            "composed_estimate", self.spec(units), base.mode, batch, imgsz, self.objects,
            int(self._static_bytes(k)), phases, max(forward, backward),
            max(phases.values()), scaled, int(k * base.input_bytes), kept_bytes=kept,
        )

    def estimate(self, recompute, batch: int, imgsz) -> StepProfile:
        """A fake-pass estimate (no per-layer FLOPs) of ``recompute`` at this batch and imgsz, with the loss formula
        of its loss region where it recomputes the loss and the optimizer phase of the base pass (``optimizer_from``:
        the step itself is not run).

        The fake pass backpropagates a stand-in of the loss (:func:`yolo_ckpt.memory.estimate.estimate_step`), so
        the loss region does not change it: one pass per units but ``"loss"``, batch and trained imgsz serves a
        policy with and without the region (the plan, ``plan``'s rows and the searches of the largest imgsz and batch
        ask for the same steps), kept across processes (:mod:`yolo_ckpt.memory.estimate_cache`) and shared by memory
        models of other base passes (the base lends it only its optimizer phase, which ``optimizer_from`` makes equal
        to the pass's own); the loss's phases are composed on it by
        :func:`yolo_ckpt.memory.estimate.with_loss_phases`, as ``estimate_step`` composes them."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        units = self.units(recompute)
        spec = recompute.spec if isinstance(recompute, RecomputePolicy) else spec_string(recompute)  # as estimate_step's policy.spec
        step = dataclasses.replace(self._pass(tuple(u for u in units if u != "loss"), batch, imgsz), recompute=spec)
        return with_loss_phases(step, *self._loss_peaks("loss" in units, batch, imgsz))
