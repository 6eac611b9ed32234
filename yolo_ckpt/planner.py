"""Plan recomputation for a memory budget: which layers (``recompute=auto``), and the largest batch or imgsz.

The planner composes the per-layer figures of one fake-tensor estimate of ``recompute=none``
(:func:`yolo_ckpt.estimate.estimate_step`) instead of running a fake pass per candidate:

- recomputing layer i frees what its forward saved for backward, less its inputs, which the checkpoint keeps
  (outputs kept anyway for skip connections are attributed to the layer that saves them, so they are never
  counted as freed twice);
- in backward, recomputing a layer rebuilds its saved tensors for a moment: the largest of them is added back;
- activations and the training batch scale with batch x imgsz^2, the loss/assigner (its forward and its backward
  peak) with its own formula, parameters and optimizer state not at all;
- an imgsz is planned at the size it trains at (:func:`yolo_ckpt.memory.train_imgsz`: 2736 -> 2752).

Among the layer sets that fit, it picks the one with the least recompute cost (forward FLOPs of the recomputed
layers): greedily by bytes freed per FLOP, then dropping layers that are no longer needed, and never worse than
the cheapest named policy (backbone, neck, all) that fits. The chosen plan is checked with one more fake pass.

On CUDA a plan against a budget in bytes keeps a :class:`Headroom` (``memory_headroom=``) on top of the estimate:
the estimate counts live tensors, a CUDA process holds more (its context, the allocator's reserve, workspaces).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .estimate import calibrate_loss, estimate_step
from .memory import TASKS, StepProfile, train_imgsz
from .policy import ModelLayout, resolve

PLANNED_TASKS = TASKS  # the tasks yolo_ckpt.estimate estimates (yolo_ckpt.memory.training_batch builds their batches)
_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_NUMBER = r"([0-9]*\.?[0-9]+)\s*([A-Za-z]*)"
_BUDGET = re.compile(rf"^\s*{_NUMBER}\s*$")
_HEADROOM = re.compile(r"^\s*(?:([0-9]*\.?[0-9]+)\s*x)?\s*(?:\+?\s*([0-9]*\.?[0-9]+\s*[A-Za-z]+))?\s*$")
UNIT_FORMS = "12GB = 12e9 bytes, 16GiB = 16*2^30; B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"


def is_fraction(value) -> bool:
    """Whether a ``memory_budget=`` value is a fraction of the CUDA memory available (no unit, or unset: batch=-1's
    default fraction) rather than bytes."""
    m = _BUDGET.match(str(value)) if value is not None else None
    return value is None or bool(m and not m.group(2))


def parse_budget(value, cuda_available_bytes: int | None = None) -> int:
    """A ``memory_budget=`` value -> bytes.

    Args:
        value: bytes with a unit, ``"12GB"`` (12e9 bytes), ``"16GiB"`` (16 * 2^30), ``"500MiB"``; or a fraction in
            (0, 1] of the memory available to the process on CUDA.
        cuda_available_bytes: that memory, as AutoBatch computes it (free plus what this process has reserved);
            None where there is no CUDA device.

    Raises:
        ValueError: naming the value and the valid forms, for a number without a unit outside (0, 1], a fraction
            where there is no CUDA device, an unknown unit, or a value <= 0.
    """
    forms = f"bytes with a unit ({UNIT_FORMS}) or a fraction in (0, 1] of the CUDA memory available"
    m = _BUDGET.match(str(value))
    if not m or isinstance(value, bool):
        raise ValueError(f"memory_budget={value!r} is not valid; use {forms}")
    number, unit = float(m.group(1)), m.group(2).upper()
    if not unit:
        if not 0 < number <= 1:
            raise ValueError(f"memory_budget={value!r}: a number without a unit must be a fraction in (0, 1]; use {forms}")
        if cuda_available_bytes is None:
            raise ValueError(f"memory_budget={value!r}: a fraction needs a CUDA device; on this device give bytes, e.g. 8GB")
        return int(number * cuda_available_bytes)
    if unit not in _UNITS:
        raise ValueError(f"memory_budget={value!r}: unknown unit '{m.group(2)}'; use {forms}")
    if number <= 0:
        raise ValueError(f"memory_budget={value!r} must be more than 0 bytes")
    return int(number * _UNITS[unit])


@dataclass(frozen=True)
class Headroom:
    """What a CUDA run holds beyond the estimate of its live tensors: ``factor`` x the estimate plus ``fixed_bytes``.

    The estimate counts tensor storage as the allocator's ``max_memory_allocated`` does. A CUDA process holds more:
    the CUDA context (outside the allocator), the caching allocator's reserve above the allocated peak
    (fragmentation, rounding of blocks), cuDNN/cuBLAS workspaces and autocast's fp16 copies of fp32 weights. The
    factor covers the parts that grow with the step, the fixed bytes the context.

    Attributes:
        factor: multiplier on the estimated peak (>= 1); fixed_bytes: bytes added (>= 0).
    """

    factor: float = 1.0
    fixed_bytes: int = 0

    def need(self, estimated_bytes: int) -> int:
        """Bytes a step of this estimated peak needs with the headroom."""
        return int(estimated_bytes * self.factor + self.fixed_bytes)

    def __str__(self) -> str:
        return f"{self.factor:g}x+{self.fixed_bytes / 2**20:g}MiB"


NO_HEADROOM = Headroom()


def parse_headroom(value) -> Headroom:
    """A ``memory_headroom=`` value -> :class:`Headroom`: ``"1.15x+500MiB"``, ``"1.2x"``, ``"800MiB"``, or ``1``/``"1x"``
    for none.

    Raises:
        ValueError: naming the value and the valid form, for anything else, a factor below 1 or an unknown unit.
    """
    form = f"FACTORx+BYTES, e.g. 1.15x+500MiB, 1.2x or 800MiB (factor >= 1; bytes with a unit: {UNIT_FORMS})"
    m = _HEADROOM.match(str(value)) if not isinstance(value, bool) else None
    if m is None or not (m.group(1) or m.group(2)):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
            return Headroom(float(value))
        raise ValueError(f"memory_headroom={value!r} is not valid; use {form}")
    factor = float(m.group(1)) if m.group(1) else 1.0
    if factor < 1:
        raise ValueError(f"memory_headroom={value!r}: the factor {factor:g} is below 1; use {form}")
    try:
        fixed = parse_budget(m.group(2), None) if m.group(2) else 0
    except ValueError:
        raise ValueError(f"memory_headroom={value!r}: '{m.group(2)}' is not bytes with a unit; use {form}") from None
    return Headroom(factor, fixed)


def headroom_for(value, device: str, memory_budget) -> Headroom:
    """The headroom a plan keeps: ``memory_headroom=`` on CUDA against a budget in bytes; none against a fraction
    (a fraction of the memory available is already a margin) or on the CPU/MPS (live tensors are all there is).

    Raises:
        ValueError: for an invalid ``memory_headroom=`` (checked whatever the device).
    """
    headroom = parse_headroom(value)
    return headroom if device == "cuda" and not is_fraction(memory_budget) else NO_HEADROOM


@dataclass
class Plan:
    """A recompute plan.

    Attributes:
        recompute: the chosen layers as a ``recompute=`` value (``"0-4,9"``, or ``"none"``).
        indices: those layer indices.
        estimated_peak_bytes: the fake-pass estimate of the plan's peak.
        budget_bytes: the budget it is held against.
        recompute_flops: forward FLOPs recomputed per step; step_flops: FLOPs of a step without recompute.
        batch, imgsz: the step the plan is for.
        headroom_bytes: what the :class:`Headroom` adds to the estimate (0 without one).
    """

    recompute: str
    indices: tuple[int, ...]
    estimated_peak_bytes: int
    budget_bytes: int
    recompute_flops: int
    step_flops: int
    batch: int
    imgsz: int
    headroom_bytes: int = 0

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


class MemoryModel:
    """Per-layer figures of one ``recompute=none`` estimate, composed for any layer set, batch and imgsz.

    Args:
        model: an Ultralytics ``BaseModel`` of any task in :data:`yolo_ckpt.memory.TASKS`, with ``.args`` set.
        imgsz, batch, objects: the step to base the figures on (activations are rescaled from it); ``imgsz`` as
            ``imgsz=`` takes it (int, list, string), here and in every method: the size that trains is planned.
        optimizer, amp: as in :func:`yolo_ckpt.estimate.estimate_step`.
        headroom: kept on top of every estimate when it is held against a budget (:func:`headroom_for`).
    """

    def __init__(self, model, imgsz, batch: int, objects: int = 20, optimizer: str = "AdamW", amp: bool = False, headroom: Headroom = NO_HEADROOM):
        self.model, self.objects, self.optimizer, self.amp, self.headroom = model, objects, optimizer, amp, headroom
        self.loss_model = calibrate_loss(model, amp)
        self.base = estimate_step(model, imgsz, batch, objects, "none", optimizer=optimizer, amp=amp, loss_model=self.loss_model)
        self.layout = ModelLayout.from_model(model)
        self.candidates = resolve("all", self.layout).indices
        self.strides = model.stride.tolist()
        rows = self.base.layers
        self.freed = {i: rows[i].freeable_bytes for i in self.candidates}
        self.rebuilt = {i: rows[i].saved_bytes for i in self.candidates}
        self.flops = {i: rows[i].forward_flops for i in self.candidates}
        self.step_flops = 3 * sum(r.forward_flops for r in rows)  # backward costs about twice the forward

    def flops_of(self, recompute) -> int:
        """Forward FLOPs recomputed per step by a ``recompute=`` value (at the base batch and imgsz)."""
        return sum(self.flops[i] for i in resolve(recompute, self.layout).indices)

    def _scale(self, batch: int, imgsz: int) -> float:
        return batch * imgsz**2 / (self.base.batch * self.base.imgsz**2)

    def peak(self, indices, batch: int, imgsz) -> int:
        """Composed peak bytes of a step recomputing ``indices`` at this batch and imgsz."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        base, k = self.base, self._scale(batch, imgsz)
        static = base.static_bytes + (k - 1) * base.input_bytes
        freed = sum(self.freed[i] for i in indices)
        rebuilt = max((self.rebuilt[i] for i in indices), default=0)
        loss = self.loss_model.forward_bytes(batch, imgsz, self.objects)
        loss_backward = self.loss_model.backward_bytes(batch, imgsz, self.objects)
        act = {p: base.phase_peak_bytes[p] - base.static_bytes for p in ("forward", "backward")}
        fwd_end = base.phase_peak_bytes["loss"] - base.loss_bytes - base.static_bytes
        return int(
            static
            + max(
                k * (act["forward"] - freed),
                k * (fwd_end - freed) + max(loss, loss_backward),
                k * (act["backward"] - freed + rebuilt),
                base.phase_peak_bytes["optimizer"] - base.static_bytes,
            )
        )

    def fits(self, estimated_bytes: int, budget: int) -> bool:
        """Whether an estimated peak plus the headroom fits ``budget`` (bytes)."""
        return self.headroom.need(estimated_bytes) <= budget

    def cheapest(self, budget: int, batch: int, imgsz: int) -> tuple[int, ...] | None:
        """The least-FLOPs layer set whose composed peak (with the headroom) fits ``budget``; None if even ``all``
        does not fit."""
        if self.fits(self.peak((), batch, imgsz), budget):
            return ()
        order = sorted(self.candidates, key=lambda i: -self.freed[i] / max(self.flops[i], 1))
        chosen: list[int] = []
        for i in order:
            chosen.append(i)
            if self.fits(self.peak(chosen, batch, imgsz), budget):
                break
        else:
            return None
        for i in sorted(chosen, key=lambda i: -self.flops[i]):  # drop what is no longer needed, dearest first
            rest = [j for j in chosen if j != i]
            if self.fits(self.peak(rest, batch, imgsz), budget):
                chosen = rest
        named = [resolve(n, self.layout).indices for n in ("backbone", "all") + (("neck",) if len(self.layout.section("neck")) else ())]
        fitting = [tuple(sorted(chosen))] + [n for n in named if self.fits(self.peak(n, batch, imgsz), budget)]
        return min(fitting, key=lambda s: sum(self.flops[i] for i in s))

    def plan(self, budget: int, batch: int, imgsz: int) -> Plan:
        """``recompute=auto``: the cheapest layer set that fits with the headroom, checked with a fake pass (layers
        are added while the check exceeds the budget).

        Raises:
            ValueError: when even recomputing every layer does not fit, saying the minimum and the headroom.
        """
        imgsz = train_imgsz(imgsz, self.model.stride)
        indices = self.cheapest(budget, batch, imgsz)
        if indices is None:  # the composition is conservative: let the fake pass decide from 'all' down
            indices = self.candidates
        while True:
            if indices is None:
                need = self.estimate("all", batch, imgsz).peak_bytes
                raise ValueError(
                    f"memory_budget={budget / 2**30:.2f} GiB is below the smallest plan's need at batch={batch} "
                    f"imgsz={imgsz}: recompute=all needs {need / 2**30:.2f} GiB ({need} bytes)"
                    + (f" and {self.headroom.need(need) / 2**30:.2f} GiB with memory_headroom={self.headroom}" if self.headroom != NO_HEADROOM else "")
                    + ". Raise the budget, or lower batch or imgsz"
                )
            spec = ",".join(map(str, indices)) or "none"
            check = self.estimate(spec, batch, imgsz)
            if self.fits(check.peak_bytes, budget):
                return self.as_plan(indices, check.peak_bytes, budget, batch, imgsz)
            rest = sorted(set(self.candidates) - set(indices), key=lambda i: -self.freed[i] / max(self.flops[i], 1))
            indices = tuple(sorted((*indices, rest[0]))) if rest else None

    def as_plan(self, indices, peak_bytes: int, budget: int, batch: int, imgsz: int) -> Plan:
        """A :class:`Plan` of these layers, with their recompute FLOPs and the headroom at this batch and imgsz."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        k = self._scale(batch, imgsz)
        spec = ",".join(map(str, sorted(indices))) or "none"
        flops = int(k * sum(self.flops[i] for i in indices))
        headroom = self.headroom.need(peak_bytes) - peak_bytes
        return Plan(spec, tuple(sorted(indices)), peak_bytes, budget, flops, int(k * self.step_flops), batch, imgsz, headroom)

    def estimate(self, recompute, batch: int, imgsz: int) -> StepProfile:
        """A fake-pass estimate (no per-layer FLOPs) of ``recompute`` at this batch and imgsz."""
        return estimate_step(
            self.model, imgsz, batch, self.objects, recompute, optimizer=self.optimizer, amp=self.amp, loss_model=self.loss_model, flops=False
        )

    def largest_batch(self, indices, budget: int, imgsz: int, limit: int = 1024) -> int:
        """The largest batch (>= 0, at most ``limit``, AutoBatch's cap) whose composed peak with ``indices`` and the
        headroom fits ``budget`` at ``imgsz``."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.fits(self.peak(indices, mid, imgsz), budget) else (lo, mid - 1)
        return lo

    def largest_imgsz(self, indices, budget: int, batch: int, stride: int = 32, limit: int = 8192) -> int:
        """The largest imgsz (a multiple of ``stride``, 0 if none) whose composed peak with the headroom fits at
        ``batch``."""
        lo, hi = 0, limit // stride
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.fits(self.peak(indices, batch, mid * stride), budget) else (lo, mid - 1)
        return lo * stride
