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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .estimate import calibrate_loss, estimate_step
from .memory import StepProfile, train_imgsz
from .policy import ModelLayout, resolve

_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_budget(value, cuda_available_bytes: int | None = None) -> int:
    """A ``memory_budget=`` value -> bytes.

    Args:
        value: bytes with a unit, ``"12GB"`` (12e9 bytes), ``"16GiB"`` (16 * 2^30), ``"500MiB"``; or a fraction in
            (0, 1] of the memory available to the process on CUDA.
        cuda_available_bytes: that memory, as AutoBatch computes it (total minus what other processes hold);
            None where there is no CUDA device.

    Raises:
        ValueError: naming the value and the valid forms, for a number without a unit outside (0, 1], a fraction
            where there is no CUDA device, an unknown unit, or a value <= 0.
    """
    forms = "bytes with a unit (12GB = 12e9 bytes, 16GiB = 16*2^30; B, KB, MB, GB, TB, KiB, MiB, GiB, TiB) or a fraction in (0, 1] of the CUDA memory available"
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


@dataclass
class Plan:
    """A recompute plan.

    Attributes:
        recompute: the chosen layers as a ``recompute=`` value (``"0-4,9"``, or ``"none"``).
        indices: those layer indices.
        estimated_peak_bytes: the fake-pass estimate of the plan's peak.
        budget_bytes: the budget it fits.
        recompute_flops: forward FLOPs recomputed per step; step_flops: FLOPs of a step without recompute.
        batch, imgsz: the step the plan is for.
    """

    recompute: str
    indices: tuple[int, ...]
    estimated_peak_bytes: int
    budget_bytes: int
    recompute_flops: int
    step_flops: int
    batch: int
    imgsz: int

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
    """

    def __init__(self, model, imgsz, batch: int, objects: int = 20, optimizer: str = "AdamW", amp: bool = False):
        self.model, self.objects, self.optimizer, self.amp = model, objects, optimizer, amp
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

    def cheapest(self, budget: int, batch: int, imgsz: int) -> tuple[int, ...] | None:
        """The least-FLOPs layer set whose composed peak fits ``budget``; None if even ``all`` does not fit."""
        if self.peak((), batch, imgsz) <= budget:
            return ()
        order = sorted(self.candidates, key=lambda i: -self.freed[i] / max(self.flops[i], 1))
        chosen: list[int] = []
        for i in order:
            chosen.append(i)
            if self.peak(chosen, batch, imgsz) <= budget:
                break
        else:
            return None
        for i in sorted(chosen, key=lambda i: -self.flops[i]):  # drop what is no longer needed, dearest first
            rest = [j for j in chosen if j != i]
            if self.peak(rest, batch, imgsz) <= budget:
                chosen = rest
        named = [resolve(n, self.layout).indices for n in ("backbone", "all") + (("neck",) if len(self.layout.section("neck")) else ())]
        fitting = [tuple(sorted(chosen))] + [n for n in named if self.peak(n, batch, imgsz) <= budget]
        return min(fitting, key=lambda s: sum(self.flops[i] for i in s))

    def plan(self, budget: int, batch: int, imgsz: int) -> Plan:
        """``recompute=auto``: the cheapest layer set that fits, checked with a fake pass (layers are added while
        the check exceeds the budget).

        Raises:
            ValueError: when even recomputing every layer does not fit, saying the minimum.
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
                    f"imgsz={imgsz}: recompute=all needs {need / 2**30:.2f} GiB ({need} bytes). Raise the budget, "
                    f"or lower batch or imgsz"
                )
            spec = ",".join(map(str, indices)) or "none"
            check = self.estimate(spec, batch, imgsz)
            if check.peak_bytes <= budget:
                return self.as_plan(indices, check.peak_bytes, budget, batch, imgsz)
            rest = sorted(set(self.candidates) - set(indices), key=lambda i: -self.freed[i] / max(self.flops[i], 1))
            indices = tuple(sorted((*indices, rest[0]))) if rest else None

    def as_plan(self, indices, peak_bytes: int, budget: int, batch: int, imgsz: int) -> Plan:
        """A :class:`Plan` of these layers, with their recompute FLOPs at this batch and imgsz."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        k = self._scale(batch, imgsz)
        spec = ",".join(map(str, sorted(indices))) or "none"
        flops = int(k * sum(self.flops[i] for i in indices))
        return Plan(spec, tuple(sorted(indices)), peak_bytes, budget, flops, int(k * self.step_flops), batch, imgsz)

    def estimate(self, recompute, batch: int, imgsz: int) -> StepProfile:
        """A fake-pass estimate (no per-layer FLOPs) of ``recompute`` at this batch and imgsz."""
        return estimate_step(
            self.model, imgsz, batch, self.objects, recompute, optimizer=self.optimizer, amp=self.amp, loss_model=self.loss_model, flops=False
        )

    def largest_batch(self, indices, budget: int, imgsz: int, limit: int = 1024) -> int:
        """The largest batch (>= 0) whose composed peak with ``indices`` fits ``budget`` at ``imgsz``."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.peak(indices, mid, imgsz) <= budget else (lo, mid - 1)
        return lo

    def largest_imgsz(self, indices, budget: int, batch: int, stride: int = 32, limit: int = 8192) -> int:
        """The largest imgsz (a multiple of ``stride``, 0 if none) whose composed peak fits at ``batch``."""
        lo, hi = 0, limit // stride
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.peak(indices, batch, mid * stride) <= budget else (lo, mid - 1)
        return lo * stride
