"""Plan recomputation for a memory budget: which units (``recompute=auto``), and the largest batch or imgsz.

The planner searches the figures of the :class:`yolo_ckpt.memory.composed.ComposedEstimate` it holds (one fake pass of
``recompute=none``, composed for any set of units, batch and imgsz; a unit is a layer, ``head``, ``loss`` or
``attention``). Among the unit sets that fit, it picks the one with the least recompute cost (forward FLOPs of the
recomputed layers and head branches, the loss region's mask products,
:meth:`~yolo_ckpt.memory.composed.ComposedEstimate.loss_flops`, and the attention region's rebuilt scores,
:meth:`~yolo_ckpt.memory.composed.ComposedEstimate.attention_flops`):
greedily by bytes freed per FLOP, then dropping units that are no longer needed, and never worse than the cheapest
named policy (backbone, neck, all) that fits. ``loss`` is in every plan where the model has it: the assigner's part
recomputes nothing, and it bounds the loss's memory where objects are many. The chosen plan is checked with one more
fake pass of that policy. A plan is a ``recompute=`` value, ``"2,4,6,head,loss"``, that
:func:`yolo_ckpt.checkpointing.policy.resolve` reads back to its units. The largest batch and imgsz are searched by
fake passes, from those already made for the same units and the composed peak's answer: the largest that fits, the
next one up shown not to, whatever size the base pass was estimated at.

:class:`MemoryModel` is the one planning entry: ``recompute=auto`` and ``batch=-1`` in the trainers,
``yolo-ckpt plan`` and the benchmark's planned cells (:mod:`yolo_ckpt.bench.planning`) all plan through it.

On CUDA a plan against a budget in bytes keeps a :class:`~yolo_ckpt.config.Headroom` (``memory_headroom=``) on top
of the estimate: the estimate counts live tensors, a CUDA process holds more (its context, the allocator's reserve,
workspaces). A budget's and a headroom's forms are read in :mod:`yolo_ckpt.config` (``Budget``, ``Headroom``); the
planner takes bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import NO_HEADROOM, Headroom
from ..errors import ConfigError
from .composed import ComposedEstimate
from .ultralytics_rules import grid_size, least_batch, train_imgsz


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


IMGSZ_LIMIT = 8192  # the largest imgsz searched by default (pixels): a search answering it means that size or more


class MemoryModel:
    """The planner: the composed figures of the :class:`~yolo_ckpt.memory.composed.ComposedEstimate` it holds
    (:attr:`composed`) searched for the cheapest units that fit a budget (:meth:`plan`), and the largest batch
    (:meth:`largest_batch`) or imgsz (:meth:`largest_imgsz`) that fits with given units; every answer checked with a
    fake pass (:meth:`estimate`). The planner holds the estimate rather than being one: the figures and fake passes
    are the estimate's (reached through :attr:`composed`, or the few methods below that hand a call to it), the search
    and the headroom the planner's.

    Args:
        model, imgsz, batch, objects, optimizer, amp: as :class:`~yolo_ckpt.memory.composed.ComposedEstimate` takes
            them.
        headroom: kept on top of every estimate when it is held against a budget
            (:meth:`yolo_ckpt.config.CkptConfig.headroom_on`).
        loss_chunk, assign_chunk, sizes, attn_chunk, mode: as :class:`~yolo_ckpt.memory.composed.ComposedEstimate`
            takes them (``mode``: ``recompute_mode=``, every fake pass's).

    Attributes:
        composed: the :class:`~yolo_ckpt.memory.composed.ComposedEstimate` of the model at the base ``imgsz`` and
            ``batch`` (per-unit figures, composed peaks, fake passes cached).
        headroom: as given.
        always: the units in every plan (``("loss",)`` where the model has a loss region: module docstring).

    Examples:
        >>> from ultralytics import YOLO
        >>> mm = MemoryModel(YOLO("yolo11n.yaml").model, imgsz=1536, batch=2)
        >>> plan = mm.plan(budget=2 * 2**30, batch=2, imgsz=1536)  # recompute=auto under 2 GiB
        >>> plan.recompute  # the policy, e.g. '0,1,2,4,6,head'
        >>> mm.largest_batch(plan.units, budget=2 * 2**30, imgsz=1536)

    Raises:
        ValueError: as :class:`~yolo_ckpt.memory.composed.ComposedEstimate` raises.
    """

    def __init__(
        self, model, imgsz, batch: int, objects: int = 20, optimizer: str = "AdamW", amp: bool = False,
        headroom: Headroom = NO_HEADROOM, loss_chunk: int | None = None, assign_chunk: int | None = None, sizes=None,
        attn_chunk: int | None = None, mode: str = "full",
    ):
        self.composed = ComposedEstimate(model, imgsz, batch, objects, optimizer, amp, loss_chunk, assign_chunk, sizes, attn_chunk, mode)
        self.headroom = headroom
        self.always = tuple(u for u in self.candidates if u == "loss")  # in every plan (module docstring)

    # What callers read of the estimate, handed to it (ComposedEstimate documents each).
    @property
    def model(self):
        """The Ultralytics model estimated."""
        return self.composed.model

    @property
    def layout(self):
        """The model's :class:`~yolo_ckpt.checkpointing.policy.ModelLayout`."""
        return self.composed.layout

    @property
    def candidates(self) -> tuple:
        """Every unit a plan may recompute: the layers, then ``"head"`` and, where the model has them, ``"loss"`` and
        ``"attention"``."""
        return self.composed.candidates

    @property
    def attention(self) -> tuple:
        """The model's attention modules' shapes (:class:`~yolo_ckpt.memory.attention_shapes.AttentionShape`)."""
        return self.composed.attention

    @property
    def attn_chunk(self) -> int:
        """Queries (and keys) per chunk of the attention region."""
        return self.composed.attn_chunk

    def units(self, recompute) -> tuple:
        """The units of a ``recompute=`` value or policy: :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.units`."""
        return self.composed.units(recompute)

    @staticmethod
    def spec(units) -> str:
        """``units`` as a ``recompute=`` value: :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.spec`."""
        return ComposedEstimate.spec(units)

    @staticmethod
    def regions(units) -> tuple[str, ...]:
        """The regions among ``units``: :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.regions`."""
        return ComposedEstimate.regions(units)

    def peak(self, units, batch: int, imgsz) -> int:
        """Composed peak bytes of ``units`` at this batch and imgsz: :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.peak`."""
        return self.composed.peak(units, batch, imgsz)

    def step(self, units, batch: int, imgsz):
        """The composed :class:`~yolo_ckpt.memory.step.StepProfile` of ``units``:
        :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.step`."""
        return self.composed.step(units, batch, imgsz)

    def estimate(self, recompute, batch: int, imgsz):
        """The fake-pass estimate of ``recompute`` at this batch and imgsz, cached:
        :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.estimate`."""
        return self.composed.estimate(recompute, batch, imgsz)

    def flops_of(self, recompute) -> int:
        """Forward FLOPs recomputed per step by ``recompute`` at the base batch and imgsz:
        :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.flops_of`."""
        return self.composed.flops_of(recompute)

    def fits(self, estimated_bytes: int, budget: int) -> bool:
        """Whether an estimated peak plus the headroom fits ``budget`` (bytes)."""
        return self.headroom.need(estimated_bytes) <= budget

    def _order(self, batch: int, imgsz: int) -> list:
        """The candidates by bytes freed per recomputed FLOP at this batch and imgsz, most first
        (:meth:`~yolo_ckpt.memory.composed.ComposedEstimate.freed_bytes`)."""
        composed = self.composed
        return sorted(self.candidates, key=lambda u: -composed.freed_bytes(u, batch, imgsz) / max(composed.cost((u,), batch, imgsz), 1))

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
        for u in sorted(optional, key=lambda u: -self.composed.cost((u,), batch, imgsz)):  # drop what is no longer needed, dearest first
            rest = [v for v in chosen if v != u]
            if self.fits(self.peak(rest, batch, imgsz), budget):
                chosen = rest
        fitting = [self._sorted(chosen)] + [n for n in self._named() if self.fits(self.peak(n, batch, imgsz), budget)]
        return min(fitting, key=lambda s: self.composed.cost(s, batch, imgsz))

    def _named(self) -> list[tuple]:
        """The units of the named policies a plan is never worse than: backbone, neck (where there is one), all;
        each with :attr:`always`."""
        names = ("backbone", "all") + (("neck",) if len(self.layout.section("neck")) else ())
        return [self._sorted((*self.units(n), *self.always)) for n in names]

    def _sorted(self, units) -> tuple:
        """``units`` in candidate order (layers ascending, then the regions)."""
        return tuple(u for u in self.candidates if u in units)

    def plan(self, budget: int, batch: int, imgsz, images: int | None = None) -> Plan:
        """``recompute=auto``: the cheapest set of units that fits with the headroom, checked with a fake pass of
        that policy, the loss region's formula with it (units are added, most bytes per FLOP first, while the check
        exceeds the budget). A named policy cheaper than the composed choice is checked first, cheapest first: the
        composition is close, not exact, the fake pass decides. ``images`` (the training set's, None: no data) caps
        the largest batch the refusal names, as it caps ``batch=-1``'s.

        Raises:
            PlanError: when even recomputing every unit (``all``) does not fit (:meth:`nothing_fits`).
        """
        imgsz = train_imgsz(imgsz, self.model.stride)
        units = self.cheapest(budget, batch, imgsz)
        if units is None:  # the composition is close, not exact: let the fake pass decide from 'all' down
            units = self.candidates
        # ... and a cheaper named policy that the composition rejects may still fit: its fake pass decides
        costs = {n: self.composed.cost(n, batch, imgsz) for n in self._named()}
        for named in sorted((n for n, c in costs.items() if c < self.composed.cost(units, batch, imgsz)), key=costs.get):
            check = self.estimate(self.spec(named), batch, imgsz)
            if self.fits(check.peak_bytes, budget):
                return self.as_plan(named, check.peak_bytes, budget, batch, imgsz)
        order = self._order(batch, imgsz)
        while True:
            if units is None:
                raise self.nothing_fits(budget, batch, imgsz, images)
            check = self.estimate(self.spec(units), batch, imgsz)
            if self.fits(check.peak_bytes, budget):
                return self.as_plan(units, check.peak_bytes, budget, batch, imgsz)
            rest = [u for u in order if u not in units]
            units = self._sorted((*units, rest[0])) if rest else None

    def nothing_fits(self, budget: int, batch: int, imgsz, images: int | None = None) -> PlanError:
        """The refusal where even recomputing every unit (``all``) does not fit ``budget`` at ``batch`` and ``imgsz``, in
        one line: ``all``'s need there by its fake pass (and with the headroom), and the largest imgsz at ``batch`` and
        the largest batch at ``imgsz`` that ``all`` fits (:meth:`largest_imgsz`, :meth:`largest_batch`, capped by the
        training set's ``images`` as ``batch=-1`` caps it), where any does."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        need = self.estimate("all", batch, imgsz).peak_bytes
        sizes = self.largest_imgsz(self.candidates, budget, batch)
        batches = self.largest_batch(self.candidates, budget, imgsz, images)
        fit = [f"imgsz={sizes} at batch={batch}"] * bool(sizes) + [f"batch={batches} at imgsz={imgsz}"] * bool(batches)
        return PlanError(
            f"memory_budget={size_text(budget)} is below the smallest plan's need at batch={batch} imgsz={imgsz}: recompute=all "
            f"needs {size_text(need)} ({need} bytes)"
            + (f" and {size_text(self.headroom.need(need))} with memory_headroom={self.headroom}" if self.headroom != NO_HEADROOM else "")
            + (f"; it fits {' or '.join(fit)}" if fit else f"; it fits no imgsz at batch={batch} nor any batch at imgsz={imgsz}")
            + ". Raise the budget, or lower batch or imgsz"
        )

    def as_plan(self, units, peak_bytes: int, budget: int, batch: int, imgsz) -> Plan:
        """A :class:`Plan` of these units, with their recompute FLOPs and the headroom at this batch and imgsz. The
        step's FLOPs: the layers' forward and backward (3x the forward) and, for segmentation, the mask loss's
        products: its forward and the backward's two, ``6 * nm * Fb * (imgsz / 4)^2``
        (:meth:`~yolo_ckpt.memory.composed.ComposedEstimate.loss_flops` x 1.5)."""
        imgsz = train_imgsz(imgsz, self.model.stride)
        headroom = self.headroom.need(peak_bytes) - peak_bytes
        return Plan(
            self.spec(units),
            peak_bytes,
            budget,
            self.composed.cost(units, batch, imgsz),
            int(self.composed.scale(batch, imgsz) * self.composed.step_flops) + 3 * self.composed.loss_flops(batch, imgsz) // 2,
            batch,
            imgsz,
            headroom,
        )

    def largest_batch(self, units, budget: int, imgsz, images: int | None = None, limit: int = 1024) -> int:
        """The largest batch (>= 0, at most ``limit``, AutoBatch's cap, and at most the training set's ``images``, as
        AutoBatch caps it by ``dataset_size``: ``ultralytics/utils/autobatch.py`` lines 124-126) whose fake pass with
        ``units`` and the headroom fits ``budget`` at ``imgsz``, the next batch shown not to fit
        (:meth:`_largest_by_fake_pass`): the same answer whatever batch the memory model's base pass was estimated at.
        The one rule of the largest batch: ``batch=-1``'s pick (:func:`~yolo_ckpt.memory.planning.decide`) and
        ``plan``'s ``max_batch``."""
        limit = min(limit, images) if images else limit
        imgsz = train_imgsz(imgsz, self.model.stride)
        least = least_batch(imgsz, self.composed.strides)
        return self._largest_by_fake_pass(units, budget, lambda b: (b, imgsz), step=1, limit=limit, least=least)

    def largest_imgsz(self, units, budget: int, batch: int, stride: int | None = None, limit: int = IMGSZ_LIMIT) -> int:
        """The largest imgsz (a multiple of ``stride``, by default the training size's grid:
        :func:`~yolo_ckpt.memory.ultralytics_rules.grid_size`; at most ``limit``, 0 if none) whose fake pass with
        ``units`` and the headroom fits ``budget`` at ``batch``, the next multiple shown not to fit
        (:meth:`_largest_by_fake_pass`): the same answer whatever imgsz the memory model's base pass was estimated at."""
        stride = stride or grid_size(self.composed.strides)
        least = next(s for s in range(stride, limit + stride + 1, stride) if batch >= least_batch(s, self.composed.strides))
        return self._largest_by_fake_pass(units, budget, lambda s: (batch, s), step=stride, limit=limit, least=least)

    def _largest_by_fake_pass(self, units, budget: int, step_at, step: int, limit: int, least: int = 1) -> int:
        """The largest multiple of ``step`` in [0, ``limit``] whose fake pass of ``units`` at ``step_at(value)`` (batch,
        imgsz) fits ``budget`` with the headroom, the next multiple up shown not to fit by its own fake pass (unless
        the answer is ``limit``'s multiple); 0 where even ``step`` does not fit. Assumes the peak grows with the value
        (monotone), as it does with batch and imgsz. A value below ``least``, the smallest that can train (one image
        at the smallest imgsz cannot: :func:`~yolo_ckpt.memory.ultralytics_rules.least_batch`), is checked by
        ``least``'s pass, and the answer is 0 where ``least`` does not fit.

        The passes the estimate already holds for these units along this line (another row's peak, another search's
        passes: :meth:`~yolo_ckpt.memory.composed.ComposedEstimate.passed`) bound the answer before any new pass.
        Each new pass is made where the composed peak, scaled to the fake pass nearest the bounds (the composition
        is close but not exact: its split of batch x imgsz^2 and x imgsz^4 terms is measured at two sizes, a layer's
        peak is the largest of several moments, the loss's own terms outgrow it), puts the answer: two passes where
        it is right (the answer and the next multiple). Where two passes in a row fall on the same side of the
        answer, the next one jumps (1, 2, 4, ... multiples up while none is known not to fit) or bisects, so a
        composition far off costs about 2 log2(multiples off) + 1 passes. Each pass is cached
        (:meth:`~yolo_ckpt.memory.composed.ComposedEstimate.estimate`)."""
        spec, top = self.spec(units), limit // step * step
        peaks: dict[int, int] = {}  # value -> its fake pass's peak bytes

        def fits(value: int) -> bool:
            if value == 0:
                return True
            if value not in peaks:
                peaks[value] = self.estimate(spec, *step_at(max(value, least))).peak_bytes
            return self.fits(peaks[value], budget)

        for held in self.composed.passed(spec):
            for value in held:
                if step_at(value) == held and 0 < value <= top and value % step == 0:
                    fits(value)

        def predicted(lo: int, upper: int) -> int:
            """The largest multiple in [lo, upper] the composed peak, scaled to the nearest fake pass, says fits."""
            near = min(peaks, key=lambda v: min(abs(v - lo), abs(v - upper)), default=None)
            ratio = peaks[near] / max(self.peak(units, *step_at(near)), 1) if near is not None else 1.0
            scaled = lambda n: ratio * self.peak(units, *step_at(lo + n * step))  # noqa: E731
            return lo + step * _largest(lambda n: self.fits(scaled(n), budget), (upper - lo) // step)

        sides, jump = [], step
        while True:
            hi = min((v for v in peaks if not fits(v)), default=None)
            lo = max((v for v in peaks if fits(v) and (hi is None or v < hi)), default=0)
            if (hi is not None and hi - lo <= step) or (hi is None and lo == top):
                return lo
            upper = top if hi is None else hi - step
            if len(sides) >= 2 and sides[-1] == sides[-2]:  # the composition is off here: jump up, or bisect
                value = min(lo + jump, top) if hi is None else (lo + hi) // (2 * step) * step
                jump *= 2
            else:
                value = max(predicted(lo, upper), lo + step)
            sides.append(fits(value))
