"""Plan recomputation for a memory budget: which units (``recompute=auto``), and the largest batch or imgsz.

A unit is what a plan recomputes or not: a layer of ``model.model`` (a nested layer with its inner blocks one at a
time, :data:`yolo_ckpt.checkpointing.engine.NESTED_BLOCKS`), ``head`` (the final head's branches) and, for detect, obb, pose and
segment models (:data:`yolo_ckpt.checkpointing.policy.LOSS_HEADS`), ``loss`` (the loss region,
:mod:`yolo_ckpt.checkpointing.losses`: the chunked
assigner and the segmentation mask loss). The planner
composes the per-layer and per-module figures of one fake-tensor estimate of ``recompute=none``
(:func:`yolo_ckpt.memory.estimate.estimate_step`) instead of running a fake pass per candidate:

- recomputing a layer or the head's branches frees what their forward saved for backward, less their inputs,
  which the checkpoint keeps, and the parameters (outputs kept anyway for skip connections are attributed to the
  layer that saves them, so they are never counted as freed twice);
- the fake pass measures, per layer, the peak live bytes while its forward ran and while its backward ran
  (:class:`yolo_ckpt.memory.layer_accounting.LayerRow`); in layer i's forward or backward the recomputed units before it hold only
  their inputs, and a recomputed unit i itself holds its freed tensors again, a nested layer one inner block at a
  time and the head one branch at a time;
- the loss's forward and backward peaks are a formula (:class:`yolo_ckpt.memory.estimate.LossModel`), the stock loss's
  or, with ``loss``, the loss region's, calibrated with the region applied in ``loss_chunk`` anchors and
  ``assign_chunk`` objects per chunk;
- activations and the training batch scale with batch x imgsz^2, the loss by its own formula, parameters and
  optimizer state not at all;
- an imgsz is planned at the size it trains at (:func:`yolo_ckpt.memory.ultralytics_rules.train_imgsz`: 2736 -> 2752).

In the tests (``tests/test_memory_model.py``) the composed peak equals the fake pass's of the same policy for layer
sets and the loss region, and is up to 2.5% below it where the head's branches are recomputed (the head holds a
little more than its largest branch); the plan's own fake pass catches that.

Among the unit sets that fit, it picks the one with the least recompute cost (forward FLOPs of the recomputed
layers and head branches, and the loss region's mask products, :meth:`MemoryModel.loss_flops`): greedily by bytes
freed per FLOP, then dropping units that are no longer needed, and never worse than the cheapest named policy
(backbone, neck, all) that fits. ``loss`` is in every plan where the model has it: the assigner's part recomputes
nothing, and it bounds the loss's memory where objects are many. The chosen plan is checked with one more fake pass of
that policy. A plan is a
``recompute=`` value, ``"2,4,6,head,loss"``, that :func:`yolo_ckpt.checkpointing.policy.resolve` reads back to its units.

:class:`MemoryModel` is the one planning entry: ``recompute=auto`` and ``batch=-1`` in the trainers,
``yolo-ckpt plan`` and the benchmark's planned cells (``benchmarks/planning.py``) all plan through it.

On CUDA a plan against a budget in bytes keeps a :class:`~yolo_ckpt.config.Headroom` (``memory_headroom=``) on top
of the estimate: the estimate counts live tensors, a CUDA process holds more (its context, the allocator's reserve,
workspaces). A budget's and a headroom's forms are read in :mod:`yolo_ckpt.config` (``Budget``, ``Headroom``); the
planner takes bytes.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from ..checkpointing.assigner import DEFAULT_ASSIGN_CHUNK
from ..checkpointing.engine import sub_regions
from ..checkpointing.losses import DEFAULT_CHUNK, apply_loss_region, remove_loss_region
from ..checkpointing.policy import REGIONS, ModelLayout, RecomputePolicy, resolve, spec_string
from ..config import NO_HEADROOM, Headroom, check_assign_chunk, check_loss_chunk
from ..errors import ConfigError
from . import estimate_cache
from .estimate import LossModel, calibrate_loss, estimate_step, with_loss_phases
from .step import StepProfile
from .ultralytics_rules import train_imgsz


def size_text(n: int) -> str:
    """Bytes as a person reads them in a message: GiB (2 decimals) from 1 GiB, else MiB (1 decimal) where that is not
    0.0, else KiB (1 decimal) from 1 KiB, else bytes (``memory_budget=1KB`` is "1000 bytes", not "0.0 MiB")."""
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if abs(n) >= 0.05 * 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB" if abs(n) >= 2**10 else f"{int(n)} bytes"


class PlanError(ConfigError):
    """No plan fits the budget (or the budget cannot be had): raised while a run sets up, which then removes or
    restores the run directory it had started (:class:`yolo_ckpt.train.trainer.CheckpointTrainerMixin`)."""


@dataclass
class Plan:
    """A recompute plan. Its policy is one field, :attr:`recompute`; the units, layers and regions are read from it.

    Attributes:
        recompute: the chosen units as a ``recompute=`` value in the planner's form (:meth:`MemoryModel.spec`: layer
            indices ascending, then the regions in :data:`yolo_ckpt.checkpointing.policy.REGIONS` order,
            ``"2,4,6,head,loss"``; ``"none"``), which :func:`yolo_ckpt.checkpointing.policy.resolve` reads back to
            the same units.
        estimated_peak_bytes: the fake-pass estimate of the plan's peak.
        budget_bytes: the budget it is held against.
        recompute_flops: forward FLOPs recomputed per step; step_flops: FLOPs of a step without recompute (the
            layers' forward and backward, and a segmentation loss's mask products: :meth:`MemoryModel.as_plan`).
        batch, imgsz: the step the plan is for.
        headroom_bytes: what the :class:`Headroom` adds to the estimate (0 without one).

    Raises:
        ValueError: when ``recompute`` is not in the planner's form (a name such as ``"backbone"``, a range, an
            unknown region).
    """

    recompute: str
    estimated_peak_bytes: int
    budget_bytes: int
    recompute_flops: int
    step_flops: int
    batch: int
    imgsz: int
    headroom_bytes: int = 0

    def __post_init__(self):
        if self.recompute != MemoryModel.spec(self.units):  # the properties below read only this form
            raise ValueError(f"Plan.recompute={self.recompute!r} is not a planner's recompute= value such as '2,4,6,head,loss' or 'none'")

    @property
    def units(self) -> tuple:
        """The planned units: layer indices (int), then the regions (``"head"``, ``"loss"``); ``()`` for ``"none"``."""
        parts = () if self.recompute == "none" else self.recompute.split(",")
        return tuple(int(p) if p.isdigit() else p for p in parts)

    @property
    def indices(self) -> tuple[int, ...]:
        """The layer indices among the units, ascending."""
        return tuple(u for u in self.units if not isinstance(u, str))

    @property
    def regions(self) -> tuple[str, ...]:
        """The regions among the units, in :data:`yolo_ckpt.checkpointing.policy.REGIONS` order (``("head", "loss")``, ``()``)."""
        return MemoryModel.regions(self.units)

    @property
    def margin_bytes(self) -> int:
        """Budget left after the estimate and the headroom (negative: it does not fit)."""
        return self.budget_bytes - self.estimated_peak_bytes - self.headroom_bytes

    @property
    def fits(self) -> bool:
        """Whether the estimate plus the headroom fits the budget."""
        return self.margin_bytes >= 0

    @property
    def recompute_cost(self) -> float:
        """Recomputed FLOPs as a fraction of a step's (forward and backward, about 3x forward) FLOPs."""
        return self.recompute_flops / self.step_flops if self.step_flops else 0.0


def _largest(fits, limit: int) -> int:
    """The largest n in [0, limit] with ``fits(n)`` (0 if none), by bisection: ``fits`` holds up to some n, not above."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


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


def loss_models(
    model, amp: bool, chunk: int | None = None, assign_chunk: int | None = None
) -> dict[bool, LossModel]:
    """The loss formula without (``False``) and, where the head has a loss region, with (``True``) the loss region
    in ``chunk`` anchors and ``assign_chunk`` objects per chunk (None: their defaults), each calibrated on a copy of
    ``model`` with or without it (:func:`yolo_ckpt.memory.estimate.calibrate_loss`, which measures ``model.loss`` as
    patched) under ``amp``.

    Raises:
        ValueError: for a bad ``chunk`` or ``assign_chunk`` (:func:`yolo_ckpt.config.check_loss_chunk`,
            :func:`yolo_ckpt.config.check_assign_chunk`).
    """
    chunk = check_loss_chunk(DEFAULT_CHUNK if chunk is None else chunk)
    objects = check_assign_chunk(DEFAULT_ASSIGN_CHUNK if assign_chunk is None else assign_chunk)
    variants = {False: None, True: (chunk, objects)} if ModelLayout.from_model(model).has_loss_region else {False: None}
    models = {}
    for on, region in variants.items():
        variant = model
        applied = (getattr(model, "loss_chunk", None), getattr(model, "assign_chunk", None))
        if applied != (region or (None, None)):  # the loss region is on, or off, where it must not be
            variant = copy.deepcopy(model)
            remove_loss_region(variant)
            if on:
                apply_loss_region(variant, *region)
        models[on] = calibrate_loss(variant, amp)
    return models


class MemoryModel:
    """Per-unit figures of one ``recompute=none`` estimate, composed for any set of units, batch and imgsz.

    A unit is what a plan recomputes or not: a layer index (a nested layer, :data:`yolo_ckpt.checkpointing.engine.NESTED_BLOCKS`,
    with its inner blocks), ``"head"`` (the final head's branches) or, where the head has a loss region
    (:data:`yolo_ckpt.checkpointing.policy.LOSS_HEADS`), ``"loss"``. Per unit, from the fake pass's per-layer and per-module
    accounting (:class:`yolo_ckpt.memory.layer_accounting.LayerRow`, :class:`yolo_ckpt.memory.layer_accounting.ModuleRow`):

    - a layer frees its ``freeable_bytes`` and holds them again while it runs (its inputs and parameters stay
      alive); a nested layer holds them less what its inner blocks free, plus what its largest inner block frees
      (the blocks run one at a time inside the layer's recomputation);
    - ``head`` frees what its branches free and holds again what the largest branch frees;
    - these are composed with the per-layer forward and backward peaks of the ``none`` pass (module docstring);
    - ``loss`` swaps the loss's forward and backward peaks for those of the loss-region formula (calibrated with the
      region applied, in ``loss_chunk`` anchors per chunk).

    Recompute cost (forward FLOPs recomputed per step): a layer's or the head branches' forward FLOPs
    (``torch.utils.flop_counter``); the loss region's, :meth:`loss_flops`.

    Args:
        model: an Ultralytics ``BaseModel`` of any task in :data:`yolo_ckpt.memory.ultralytics_rules.TASKS`, with ``.args`` set
            (a policy applied to it is ignored: its figures are of the stock model).
        imgsz, batch, objects: the step to base the figures on (activations are rescaled from it); ``imgsz`` as
            ``imgsz=`` takes it (int, list, string), here and in every method: the size that trains is planned.
        optimizer, amp: as in :func:`yolo_ckpt.memory.estimate.estimate_step`.
        headroom: kept on top of every estimate when it is held against a budget (:meth:`yolo_ckpt.config.CkptConfig.headroom_on`).
        loss_chunk: anchors per forward chunk of the loss region's mask loss (``loss_chunk=``); None: its default.
        assign_chunk: objects per chunk of the loss region's assigner (``assign_chunk=``); None: its default.
        sizes: the training set's :class:`~yolo_ckpt.memory.foreground.ObjectSizes` (the loss's foreground anchors
            bounded by its boxes' sizes); None: the worst size, ``objects * topk`` anchors per image.

    Raises:
        ValueError: for a bad ``loss_chunk`` or ``assign_chunk``, and as :func:`yolo_ckpt.memory.estimate.estimate_step` raises.
    """

    def __init__(
        self, model, imgsz, batch: int, objects: int = 20, optimizer: str = "AdamW", amp: bool = False,
        headroom: Headroom = NO_HEADROOM, loss_chunk: int | None = None, assign_chunk: int | None = None, sizes=None,
    ):
        self.model, self.objects, self.optimizer, self.amp, self.headroom = model, objects, optimizer, amp, headroom
        self.sizes = sizes
        self.layout = ModelLayout.from_model(model)
        self.loss_models = loss_models(model, amp, loss_chunk, assign_chunk)
        # The fake pass without the loss's share (a formula of zeros): the loss's peaks are composed per unit below.
        zeros = (0.0,) * len(self.loss_models[False].forward)
        self._no_loss = no_loss = dataclasses.replace(self.loss_models[False], forward=zeros, backward=zeros, pair_bytes=0.0)
        self._key = (estimate_cache.model_key(model), objects, optimizer, amp)
        self._base_key = (*self._key, "base", batch, train_imgsz(imgsz, model.stride), repr(no_loss))
        self.base = _cached_step(
            self._base_key, lambda: estimate_step(model, imgsz, batch, objects, "none", optimizer=optimizer, amp=amp, loss_model=no_loss)
        )
        self.candidates = self.units("all")  # the layers, then "head" and, where there is one, "loss"
        self.always = tuple(u for u in self.candidates if u == "loss")  # in every plan (module docstring)
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
        return ",".join([*map(str, layers), *MemoryModel.regions(units)]) or "none"

    def _static_bytes(self, k: float) -> float:
        """Bytes alive all step long at ``k`` times the base pass's batch x pixels: its static bytes, the batch scaled."""
        return self.base.static_bytes + (k - 1) * self.base.input_bytes

    def _scale(self, batch: int, imgsz: int) -> float:
        return batch * imgsz**2 / (self.base.batch * self.base.imgsz**2)

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
        """Forward FLOPs recomputed per step by ``units`` at this batch and imgsz."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        k = self._scale(batch, imgsz)
        return int(k * sum(self.flops[u] for u in units if u != "loss")) + (self.loss_flops(batch, imgsz) if "loss" in units else 0)

    def flops_of(self, recompute) -> int:
        """Forward FLOPs recomputed per step by a ``recompute=`` value (at the base batch and imgsz)."""
        return self.cost(self.units(recompute), self.base.batch, self.base.imgsz)

    def _loss_peaks(self, loss: bool, batch: int, imgsz: int) -> tuple[int, int]:
        model = self.loss_models[loss]
        return model.forward_bytes(batch, imgsz, self.objects, self.sizes), model.backward_bytes(batch, imgsz, self.objects, self.sizes)

    def peak(self, units, batch: int, imgsz) -> int:
        """Composed peak bytes of a step recomputing ``units`` (layer indices, ``"head"``, ``"loss"``) at this
        batch and imgsz: the largest of its :meth:`phase_peaks`."""
        return max(self.phase_peaks(units, batch, imgsz).values())

    def phase_peaks(self, units, batch: int, imgsz) -> dict[str, int]:
        """Composed peak bytes inside each phase (``forward``, ``loss``, ``backward``, ``optimizer``) of a step
        recomputing ``units`` at this batch and imgsz, static bytes included."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        base, k = self.base, self._scale(batch, imgsz)
        static = self._static_bytes(k)
        layers = {self.layout.head if u == "head" else u: u for u in units if u != "loss"}  # layer index -> unit
        freed = sum(self.freed[u] for u in layers.values())
        loss, loss_backward = self._loss_peaks("loss" in units, batch, imgsz)
        fwd_end = base.phase_peak_bytes["loss"] - base.loss_bytes - base.static_bytes
        # In the backward of layer i the none pass held what the layers before it saved: a recomputed one among them
        # holds only its inputs; a recomputed layer i itself rebuilds its freed bytes (a nested one block at a time).
        # The same in its forward (a recomputed layer's runs whole, a nested one's or the head's a block at a time).
        def held(r, peak: int) -> int:
            before = sum(self.freed[u] for i, u in layers.items() if i < r.index)
            own = self.freed[layers[r.index]] - self.rebuilt[layers[r.index]] if r.index in layers else 0
            return peak - base.static_bytes - before - own

        above_static = {
            "forward": k * max(held(r, r.forward_peak_bytes) for r in base.layers),
            "loss": k * (fwd_end - freed) + max(loss, loss_backward),
            "backward": k * max(held(r, r.backward_peak_bytes) for r in base.layers),
            "optimizer": base.phase_peak_bytes["optimizer"] - base.static_bytes,
        }
        return {phase: int(static + bytes_) for phase, bytes_ in above_static.items()}

    def step(self, units, batch: int, imgsz) -> StepProfile:
        """The composed step of ``units`` at this batch and imgsz as a :class:`~yolo_ckpt.memory.step.StepProfile`
        (source ``"composed_estimate"``, no fake pass): its :meth:`phase_peaks` and peak, the static and batch bytes,
        the loss formula's share, and the layer rows of the ``recompute=none`` base pass with their bytes and FLOPs
        scaled to this batch and imgsz (what each layer saves when it is kept; per-layer peaks 0: not composed)."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        base, k = self.base, self._scale(batch, imgsz)
        phases = self.phase_peaks(units, batch, imgsz)
        scaled = [
            dataclasses.replace(
                r, output_bytes=int(k * r.output_bytes), saved_bytes=int(k * r.saved_bytes), freeable_bytes=int(k * r.freeable_bytes),
                forward_flops=int(k * r.forward_flops), forward_peak_bytes=0, backward_peak_bytes=0,
            )
            for r in base.layers
        ]
        return StepProfile(
            "composed_estimate", self.spec(units), base.mode, batch, imgsz, self.objects,
            int(self._static_bytes(k)), phases, max(self._loss_peaks("loss" in units, batch, imgsz)),
            max(phases.values()), scaled, int(k * base.input_bytes),
        )

    def fits(self, estimated_bytes: int, budget: int) -> bool:
        """Whether an estimated peak plus the headroom fits ``budget`` (bytes)."""
        return self.headroom.need(estimated_bytes) <= budget

    def _order(self, batch: int, imgsz: int) -> list:
        """The candidates by bytes freed per recomputed FLOP at this batch and imgsz, most first (the loss region's
        bytes: how much lower its loss peaks are)."""
        k = self._scale(batch, imgsz)

        def freed(u) -> float:
            if u != "loss":
                return k * self.freed[u]
            return max(self._loss_peaks(False, batch, imgsz)) - max(self._loss_peaks(True, batch, imgsz))

        return sorted(self.candidates, key=lambda u: -freed(u) / max(self.cost((u,), batch, imgsz), 1))

    def cheapest(self, budget: int, batch: int, imgsz) -> tuple | None:
        """The least-FLOPs set of units, :attr:`always` among them, whose composed peak (with the headroom) fits
        ``budget``; None if even ``all`` does not fit."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        if self.fits(self.peak(self.always, batch, imgsz), budget):
            return self.always
        chosen: list = list(self.always)
        for u in (u for u in self._order(batch, imgsz) if u not in self.always):
            chosen.append(u)
            if self.fits(self.peak(chosen, batch, imgsz), budget):
                break
        else:
            return None
        optional = [u for u in chosen if u not in self.always]
        for u in sorted(optional, key=lambda u: -self.cost((u,), batch, imgsz)):  # drop what is no longer needed, dearest first
            rest = [v for v in chosen if v != u]
            if self.fits(self.peak(rest, batch, imgsz), budget):
                chosen = rest
        fitting = [self._sorted(chosen)] + [n for n in self._named() if self.fits(self.peak(n, batch, imgsz), budget)]
        return min(fitting, key=lambda s: self.cost(s, batch, imgsz))

    def _named(self) -> list[tuple]:
        """The units of the named policies a plan is never worse than: backbone, neck (where there is one), all;
        each with :attr:`always`."""
        names = ("backbone", "all") + (("neck",) if len(self.layout.section("neck")) else ())
        return [self._sorted((*self.units(n), *self.always)) for n in names]

    def _sorted(self, units) -> tuple:
        """``units`` in candidate order (layers ascending, then the regions)."""
        return tuple(u for u in self.candidates if u in units)

    def plan(self, budget: int, batch: int, imgsz) -> Plan:
        """``recompute=auto``: the cheapest set of units that fits with the headroom, checked with a fake pass of
        that policy, the loss region's formula with it (units are added, most bytes per FLOP first, while the check
        exceeds the budget). A named policy cheaper than the composed choice is checked first, cheapest first: the
        composition is close, not exact, the fake pass decides.

        Raises:
            PlanError: when even recomputing every unit (``all``) does not fit, saying the minimum and the headroom.
        """
        imgsz = train_imgsz(imgsz, self.model.stride)
        units = self.cheapest(budget, batch, imgsz)
        if units is None:  # the composition is close, not exact: let the fake pass decide from 'all' down
            units = self.candidates
        # ... and a cheaper named policy that the composition rejects may still fit: its fake pass decides
        cost = self.cost(units, batch, imgsz)
        for named in sorted((n for n in self._named() if self.cost(n, batch, imgsz) < cost), key=lambda n: self.cost(n, batch, imgsz)):
            check = self.estimate(self.spec(named), batch, imgsz)
            if self.fits(check.peak_bytes, budget):
                return self.as_plan(named, check.peak_bytes, budget, batch, imgsz)
        order = self._order(batch, imgsz)
        while True:
            if units is None:
                need = self.estimate("all", batch, imgsz).peak_bytes
                raise PlanError(
                    f"memory_budget={size_text(budget)} is below the smallest plan's need at batch={batch} "
                    f"imgsz={imgsz}: recompute=all needs {size_text(need)} ({need} bytes)"
                    + (
                        f" and {size_text(self.headroom.need(need))} with memory_headroom={self.headroom}"
                        if self.headroom != NO_HEADROOM
                        else ""
                    )
                    + ". Raise the budget, or lower batch or imgsz"
                )
            check = self.estimate(self.spec(units), batch, imgsz)
            if self.fits(check.peak_bytes, budget):
                return self.as_plan(units, check.peak_bytes, budget, batch, imgsz)
            rest = [u for u in order if u not in units]
            units = self._sorted((*units, rest[0])) if rest else None

    def as_plan(self, units, peak_bytes: int, budget: int, batch: int, imgsz) -> Plan:
        """A :class:`Plan` of these units, with their recompute FLOPs and the headroom at this batch and imgsz. The
        step's FLOPs: the layers' forward and backward (3x the forward) and, for segmentation, the mask loss's
        products: its forward and the backward's two, ``6 * nm * Fb * (imgsz / 4)^2`` (:meth:`loss_flops` x 1.5)."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        headroom = self.headroom.need(peak_bytes) - peak_bytes
        return Plan(
            self.spec(units),
            peak_bytes,
            budget,
            self.cost(units, batch, imgsz),
            int(self._scale(batch, imgsz) * self.step_flops) + 3 * self.loss_flops(batch, imgsz) // 2,
            batch,
            imgsz,
            headroom,
        )

    def estimate(self, recompute, batch: int, imgsz) -> StepProfile:
        """A fake-pass estimate (no per-layer FLOPs) of ``recompute`` at this batch and imgsz, with the loss formula
        of its loss region where it recomputes the loss and the optimizer phase of the base pass (``optimizer_from``:
        the step itself is not run).

        The fake pass backpropagates a stand-in of the loss (:func:`yolo_ckpt.memory.estimate.estimate_step`), so
        the loss region does not change it: one pass per units but ``"loss"``, batch and trained imgsz serves a
        policy with and without the region (the plan, ``plan``'s rows and the checks of the largest imgsz and batch
        ask for the same steps), kept across processes (:mod:`yolo_ckpt.memory.estimate_cache`); the loss's phases
        are composed on it by :func:`yolo_ckpt.memory.estimate.with_loss_phases`, as ``estimate_step`` composes them."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        units = self.units(recompute)
        layers = tuple(u for u in units if u != "loss")
        key = (layers, batch, imgsz)
        if key not in self._passes:
            self._passes[key] = _cached_step((*self._key, *key, repr(self._no_loss), self._base_key), lambda: estimate_step(
                self.model, imgsz, batch, self.objects, self.spec(layers), optimizer=self.optimizer, amp=self.amp,
                loss_model=self._no_loss, flops=False, optimizer_from=self.base,
            ))
        spec = recompute.spec if isinstance(recompute, RecomputePolicy) else spec_string(recompute)  # as estimate_step's policy.spec
        step = dataclasses.replace(self._passes[key], recompute=spec)
        return with_loss_phases(step, *self._loss_peaks("loss" in units, batch, imgsz))

    def largest_batch(self, units, budget: int, imgsz, limit: int = 1024) -> int:
        """The largest batch (>= 0, at most ``limit``, AutoBatch's cap) whose estimate with ``units`` and the headroom
        fits ``budget`` at ``imgsz``: the composed peak's answer, checked with a fake pass (:meth:`_checked`)."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        batch = _largest(lambda b: self.fits(self.peak(units, b, imgsz), budget), limit)
        return self._checked(units, budget, batch, lambda b: (b, imgsz), exponent=1, step=1)

    def largest_imgsz(self, units, budget: int, batch: int, stride: int = 32, limit: int = 8192) -> int:
        """The largest imgsz (a multiple of ``stride``, 0 if none) whose estimate with ``units`` and the headroom fits
        at ``batch``: the composed peak's answer, checked with a fake pass (:meth:`_checked`)."""
        steps = _largest(lambda n: self.fits(self.peak(units, batch, n * stride), budget), limit // stride)
        return self._checked(units, budget, steps * stride, lambda s: (batch, s), exponent=2, step=stride)

    def _checked(self, units, budget: int, value: int, step_at, exponent: int, step: int) -> int:
        """``value`` (a batch or an imgsz from the composed peak) lowered until the fake pass of ``units`` at
        ``step_at(value)`` (batch, imgsz) fits ``budget`` with the headroom: the composition scales activations
        with batch x imgsz^2, which attention (its token count squared) and the loss's own terms outgrow. Each try
        shrinks ``value`` by the overshoot, ``(budget / need)^(1/exponent)``, in multiples of ``step``, at least
        one step."""
        spec = self.spec(units)
        while value > 0:
            peak = self.estimate(spec, *step_at(value)).peak_bytes
            if self.fits(peak, budget):
                return value
            value = min(value - step, int(value * (budget / self.headroom.need(peak)) ** (1 / exponent)) // step * step)
        return 0
