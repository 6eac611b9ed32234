"""Estimate the peak memory of a training step without computing it: fake tensors plus a calibrated loss formula.

The model's forward, backward and optimizer step run on fake tensors (``torch._subclasses.FakeTensorMode``: shapes,
dtypes and storages, no data), with the recompute policy applied, and :class:`~yolo_ckpt.memory.tracker.LiveTensorTracker`
counts the live storages as on the CPU: parameters, buffers, gradients, the optimizer state Ultralytics' own
builder gives (:func:`~yolo_ckpt.memory.ultralytics_rules.build_optimizer`), the task's training batch
(:func:`~yolo_ckpt.memory.training_batch.training_batch`) and activations. Fake tensors cannot run the loss: its task-aligned
assigner has data-dependent ops (``nonzero``, ``topk`` over the targets). Its memory is a formula per task
(:class:`LossModel`), fitted to CPU measurements of the real loss at small sizes
(:func:`calibrate_loss`); the fake pass backpropagates a stand-in loss with dense gradients of the same shapes.

The formula's terms, in batch B, anchors A, objects per image M: ``1, B*A, B*A*M, B*M`` (assigner and box losses:
detect, pose, obb; with the loss region's chunked assigner, whose dense (objects, anchors) rows are one image's chunk
of ``assign_chunk`` objects at a time, ``A*min(M, assign_chunk)`` in place of ``B*A*M``: measured on yolo11n at 1024 px,
batch 1, objects of 8-28 px, its loss peak is 19, 37 and 38 MiB at 20, 600 and 1500 objects, where ``B*A*M`` fitted
19, 27 and 38), plus for segmentation the mask loss, whose per-image tensors grow with foreground anchors x
mask pixels P = (imgsz / mask_ratio)^2: ``Fb*P, B*M*P, F1*P, B*P``, with Fb the batch's foreground anchors (over
the loss's assigners: an end-to-end loss has two) and F1 the most that one assigner gives one image (the
temporaries of one image's mask loss). Calibration counts the real foreground (the assigner's ``fg_mask``); the
estimate takes its bound, ``min(M * topk, A)`` per image and assigner, so it does not under-estimate where objects
overlap or are small and claim fewer anchors; with the training set's box sizes (``data=``,
:class:`~yolo_ckpt.memory.foreground.ObjectSizes`) also at most the anchors each object's box can hold at its largest
augmented size, ``topk`` at most per object, summed per image (an object smaller than the anchor grid can only be given
the few anchors inside it: on yolo11n-seg at 640 px with 400 objects of 1-3% of the side the worst-size bound is 2.1x
the foreground the assigner gives, and the step's estimate 1.83x the measured peak,
``benchmarks/results/foreground-decomposition``). YOLO26's ``SegTaskAlignedAssigner`` also decodes the predicted
masks of each object's ``3 * topk`` best candidates (its mask IoU), in chunks of 2^27 mask pixels: one more term
per such assigner, the most pixels decoded at once (:func:`_decoded`, for at most ``min(M * 3 * topk, A)``
candidates per image), and one for the chunk it keeps decoded while it decodes the next (:func:`_previous`); with the
loss region, where nothing of the first assigner's loss that grows with the foreground is alive while the second
decodes (an end-to-end loss's two run one after the other) and each chunk is freed before the next, one term, the
larger decoding. Each last term at no fewer than :data:`DECODED_BYTES_PER_PIXEL` bytes a pixel. With the loss region
(``yolo_ckpt.checkpointing.losses``: each image's mask loss run in chunks of ``chunk`` anchors in forward and
recomputed in backward in tiles of fewer than ``2 * ANCHOR_TILE`` anchors, then by mask rows in tiles of about
``PIXEL_TILE`` anchor-pixels) no tensor holds a batch's or an image's whole foreground x P: its mask terms are
``B*M*P, tile(F1, P), B*P, min(chunk, F1)*P``, with ``tile`` the most anchor-pixels of one backward tile
(:func:`_tile_pixels`; the fit measures the recomputed loss). Without that structure the calibration's small steps (F1
at most the 525 anchors of 160 px, where every tile is the whole ``F1*P``) let the fit put the region's backward on
``F1*P``, which MoNuSeg's densest mosaic (1024 px, batch 2, recompute=all: 18880 foreground anchors per image bound)
extrapolated to 10590 MiB against 898 measured.
Classification: ``1, B``.
Semantic segmentation and depth, whose losses upsample the predictions to the input's resolution (Ultralytics'
``SemanticSegmentationLoss``, ``DepthLoss26``), in full-resolution pixels P = imgsz^2: depth ``1, B*P``; semantic
``1, B*P, [B > 1]*B*P``, the last the copy of the (B, nc, H, W) logits that the loss's channel-last ``reshape``
makes past batch 1 (at batch 1 it is a view); the per-pixel coefficients hold the class count, fitted per ``nc``
(and the calibration's points differ in batch and imgsz only: these batches have no objects). Two
fits: the loss's forward peak and its backward peak (above what was alive before the loss), since the mask loss's
backward peaks above its forward. Least-squares fits, but for segmentation, whose estimate must not fall under the
measurement, an upper bound of its calibration measurements (a linear program, ``scipy.optimize.linprog``:
non-negative coefficients, no measurement under-estimated, the least total relative over-estimate), since its peak
is a maximum over moments of the loss (two assigners' decoding, each image's mask loss) that a sum of terms only
approximates; its mask-pixel coefficients then carry :data:`MASK_TERMS_MARGIN`, since a bound of the calibration's
small sizes is not one of sizes far above them.

Not counted: the dataloader and its workers, validation (a separate phase), CUDA's context and cuDNN workspaces,
allocator fragmentation (``memory_reserved`` above ``memory_allocated``), GradScaler and DDP buffers.

AMP (Ultralytics runs it on CUDA only): the fake pass and the loss calibration run under CUDA fp16 autocast's dtypes,
emulated on the CPU (:func:`yolo_ckpt.memory.amp.cuda_amp_emulated`: CPU autocast in fp16, with the ops CUDA autocast
keeps in fp32, softmax among them, run in fp32).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import math
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map
from ultralytics.utils.tal import SegTaskAlignedAssigner

from ..checkpointing.engine import apply_checkpointing, remove_checkpointing
from ..checkpointing.losses import ANCHOR_TILE, PIXEL_TILE
from . import estimate_cache
from .amp import cuda_amp_emulated
from .foreground import candidate_pairs
from .layer_accounting import LayerAccounting, module_flops
from .step import StepProfile, run_step
from .tracker import LiveTensorTracker, tensor_bytes
from .training_batch import training_batch
from .ultralytics_rules import OBJECTLESS_TASKS, anchors, build_optimizer, model_task, train_imgsz

# (batch, imgsz, objects per image) at which the real loss is measured to fit its formula: small (imgsz <= 160), so
# fast, and spread in every term (1 to 3 images, 1 to 240 objects: below and above the anchors' count) so that the
# fit does not confuse one term with another and extrapolates to sizes far above these.
# Dense scenes: hundreds to thousands of objects over thousands of anchors, where the stock assigner's (batch, objects,
# anchors) tensors hold the loss's peak. Without these points the fit took that term from steps of at most 240
# objects over 525 anchors and fell under it 100x beyond: yolo11n at 1024 px, batch 1, recompute=none, 600 objects
# -4.8%, 1500 objects -10% (CPU live-tensor peaks, 8-28 px boxes); with them +0.4% to +0.6% at 200, 600 and 1500.
# At 160 px or less, so that the steps the tests check at twice the largest size still extrapolate.
DENSE_POINTS = ((1, 160, 600), (1, 160, 1500), (2, 128, 900))
CALIBRATION_POINTS = tuple(
    (b, s, m)
    for i, (b, s) in enumerate((b, s) for b in (1, 2, 3) for s in (64, 96, 128, 160))
    for m in ((1, 2, 4, 6, 9, 14)[i % 6], (20, 30, 45, 70, 110, 160, 240)[i % 7])
) + DENSE_POINTS

# The candidate pairs (object, anchor whose centre is in its box), over which the task-aligned assigner computes its
# overlaps pair by pair (stock holds ~120 bytes a pair at once; the loss region ~14, yolo_ckpt.checkpointing.assigner),
# grow with the boxes' areas: the grid-laid points above hold about one per anchor, so the fitted terms carry that
# many, and large boxes that overlap carry objects x anchors. The same objects at boxes of 60% of the side and then of
# the whole image differ in their pairs only (about twice as many, both more than the loss region's PAIR_PIECE): the
# assigner's own peak's difference over the pairs' difference is the bytes of each pair beyond one per anchor
# (:attr:`LossModel.pair_bytes`; the assigner's, not the loss's: a segmentation loss's peak can be its mask loss).
# Without it yolo11n at 1024 px, batch 1, 300 boxes of 30-90% of the side was 24% under (recompute=none) and 44%
# under with the default policy, its loss phase 362 MiB measured against 52 estimated; with it +6.2% and +1.5%.
PAIR_POINTS = ((1, 160, 100, (0.6, 0.6)), (1, 160, 100, (1.0, 1.0)))

# A segmentation fit is an upper bound of its calibration measurements, not of sizes beyond them: there its terms that
# do not grow with the mask pixels (1, B*A, ...) hold slack that the fit trades for lower mask-pixel coefficients, so
# it falls short where the mask terms dominate. Measured without a margin (CPU fp32, steps at 256-1024 px, 20-600
# objects): yolo11n-seg's step peak up to 1.0% under (2 x 512 px, 300 objects; 2 x 1024 px, 415), its loss's backward
# peak 1.2%; yolo26n-seg's up to 0.6% (1 x 512 px, 300). With it all 48 steps of benchmarks/results/estimate-accuracy
# are over: yolo11n-seg +1.7% to +17.4%, yolo26n-seg +0.9% to +31.9% (the high end where grid-laid objects claim
# fewer anchors than the foreground bound, and, for yolo26n-seg, decode fewer chunks than its bound: _previous).
MASK_TERMS_MARGIN = 0.05

# Bytes per mask pixel that YOLO26's SegTaskAlignedAssigner.pair_overlaps (ultralytics/utils/tal.py) holds while it
# decodes, on the CPU where the calibration measures it: each pixel's bool mask (`> 0`, 1 B) with the float32 product
# it comes from, and later with its float32 copy (`pm.to(dtype)`, float off CUDA): 4 + 1. The least coefficient of
# the formula's last term: the loss region's decoding, and the stock loss's previous chunk (:func:`_previous`, 0 at
# every calibration point: its chunks of 2^27 pixels hold every calibration batch). The calibration's points
# (<= 160 px) decode too few pixels to tell the decoding from the other terms: fitted, the region's came out at 3.3
# and 1.9 B per pixel for the two assigners, and yolo26n-seg at 512 px, batch 2, 100 objects, recompute=all, was 1.3%
# under (benchmarks/results/estimate-accuracy-all); at batch 4, 480 px, 200 objects, where the assigners decode one
# image a chunk, the stock loss's forward was 17% under and the region's 34% (it kept a chunk's masks too, as stock
# does: it frees them now). The stock loss's own two decoding terms stay fitted: at that floor they would count its
# two assigners' decodings at once (796 MiB at the 512 px step, where its whole loss measured 620 MiB).
DECODED_BYTES_PER_PIXEL = 5.0


@dataclass(frozen=True)
class LossModel:
    """Bytes of the loss's peaks above what was alive before it, linear in the task's terms (module docstring).

    Attributes:
        task: the model's task; strides: its head's strides; mask_ratio: prototype pixels per mask pixel side.
        topk: per assigner of a segmentation loss, the anchors one object can claim (``min(topk, topk2)``).
        forward, backward: the coefficients (bytes per unit of each term) of the loss's forward peak and of its
            backward peak.
        chunk: anchors per chunk of the loss region (``yolo_ckpt.checkpointing.losses``: the mask loss recomputed in backward,
            its forward run in chunks), whose mask terms are one image's chunk or tile of anchors (module docstring);
            None for the stock loss.
        mask_topk: per mask-scoring assigner (YOLO26's ``SegTaskAlignedAssigner``), the candidates per object whose
            masks it decodes (``3 * topk``); empty for other losses.
        assign_chunk: objects per chunk of the loss region's assigner (:mod:`yolo_ckpt.checkpointing.assigner`), whose
            dense rows are one image's chunk at a time: its term is ``A * min(M, assign_chunk)`` instead of the stock
            assigner's ``B*A*M``; None for the stock loss.
        pair_bytes: the forward's bytes per candidate pair beyond one per anchor (:data:`PAIR_POINTS`), added to the
            formula's forward peak for :meth:`pairs` beyond ``B*A``; 0 for a task without boxes.
    """

    task: str
    strides: tuple[float, ...]
    mask_ratio: int
    topk: tuple[int, ...]
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    chunk: int | None = None
    mask_topk: tuple[int, ...] = ()
    assign_chunk: int | None = None
    pair_bytes: float = 0.0

    def terms(self, batch: int, imgsz: int, objects: int, foreground: tuple[int, int] | None = None, sizes=None) -> np.ndarray:
        """The formula's terms for this step; ``foreground`` (the batch's foreground anchors over the loss's
        assigners, and the most one assigner gives one image) is measured in calibration and otherwise its bound
        (:meth:`foreground`, by the data's box sizes where ``sizes`` is given)."""
        if self.task == "classify":
            return np.array([1.0, batch])
        if self.task == "semantic":  # per-pixel losses at the input's resolution (module docstring)
            return np.array([1.0, batch * imgsz**2, (batch > 1) * batch * imgsz**2])
        if self.task == "depth":
            return np.array([1.0, batch * imgsz**2])
        b, a, m = batch, anchors(imgsz, self.strides), objects
        assigned = a * min(m, self.assign_chunk) if self.assign_chunk else b * a * m  # the assigner's dense rows
        terms = [1.0, b * a, assigned, b * m]
        if self.task == "segment":
            pixels = (imgsz // self.mask_ratio) ** 2
            foreground = foreground or self.foreground(batch, imgsz, objects, sizes)
            if self.chunk:  # the loss region: one image's chunk (forward) or tile (backward) of anchors at a time
                terms += [b * m * pixels, _tile_pixels(foreground[1], pixels), b * pixels, min(self.chunk, foreground[1]) * pixels]
            else:
                terms += [foreground[0] * pixels, b * m * pixels, foreground[1] * pixels, b * pixels]
            # the mask-scoring assigners' decodings (3 * topk candidates per object); with the loss region nothing of
            # the first's loss that grows with the foreground is alive while the second decodes: the larger one. The
            # stock assigner keeps a chunk's decoded masks while it decodes the next: that chunk too
            candidates = [self._per_image(imgsz, objects, k, sizes) for k in self.mask_topk]
            decoded = [_decoded(b, m, pixels) for m in candidates]
            if self.chunk and decoded:
                terms.append(max(decoded))
            elif decoded:
                terms += [*decoded, max(_previous(b, m, pixels) for m in candidates)]
        return np.array(terms, dtype=float)

    def term_names(self) -> list[str]:
        """The names of :meth:`terms`' terms, in its order (B batch, A anchors, M objects per image, P mask pixels,
        Fb and F1 foreground anchors, ``tile`` the loss region's largest backward tile: :func:`_tile_pixels`)."""
        if self.task == "classify":
            return ["1", "B"]
        if self.task == "semantic":
            return ["1", "B*P", "[B>1]*B*P"]
        if self.task == "depth":
            return ["1", "B*P"]
        names = ["1", "B*A", f"A*min(M,{self.assign_chunk})" if self.assign_chunk else "B*A*M", "B*M"]
        if self.task == "segment":
            names += ["B*M*P", "tile(F1,P)", "B*P", f"min({self.chunk},F1)*P"] if self.chunk else ["Fb*P", "B*M*P", "F1*P", "B*P"]
            if self.chunk and self.mask_topk:
                names.append(f"decoded(3*topk={max(self.mask_topk)})")
            elif self.mask_topk:
                names += [*(f"decoded(3*topk={k})" for k in self.mask_topk), "decoded before the next chunk"]
        return names

    def pairs(self, batch: int, imgsz: int, objects: int, sizes=None) -> int:
        """The bound on the batch's candidate pairs (object, anchor whose centre is in its box): ``batch`` times the
        most one image holds by ``sizes`` (:meth:`~yolo_ckpt.memory.foreground.ObjectSizes.pairs_per_image`), without
        sizes every box the whole image: ``objects * anchors``; 0 for a task without boxes."""
        if self.task in OBJECTLESS_TASKS:
            return 0
        a = anchors(imgsz, self.strides)
        return batch * (objects * a if sizes is None else sizes.pairs_per_image(imgsz, self.strides, a))

    def foreground(self, batch: int, imgsz: int, objects: int, sizes=None) -> tuple[int, int]:
        """The bound on a segmentation loss's foreground anchors: the batch's, summed over the loss's assigners, and
        the most one assigner gives one image, each :meth:`_per_image` (module docstring)."""
        per_loss = [self._per_image(imgsz, objects, k, sizes) for k in self.topk]
        return batch * sum(per_loss), max(per_loss)

    def _per_image(self, imgsz: int, objects: int, topk: int, sizes=None) -> int:
        """The most anchors an assigner that keeps ``topk`` per object gives one image: ``min(objects * topk,
        anchors)`` and, with the data's :class:`~yolo_ckpt.memory.foreground.ObjectSizes`, at most what its boxes hold
        at their largest augmented size (:meth:`~yolo_ckpt.memory.foreground.ObjectSizes.per_image`)."""
        most = min(objects * topk, anchors(imgsz, self.strides))
        return most if sizes is None else min(most, sizes.per_image(imgsz, self.strides, topk))

    def forward_bytes(self, batch: int, imgsz: int, objects: int, sizes=None) -> int:
        """The loss's forward peak (bytes) above what was alive before it: its saved tensors and temporaries, with the
        assigner's candidate pairs beyond one per anchor at :attr:`pair_bytes` each (:meth:`pairs`)."""
        beyond = max(0, self.pairs(batch, imgsz, objects, sizes) - batch * anchors(imgsz, self.strides)) if self.pair_bytes else 0
        return max(0, int(self.terms(batch, imgsz, objects, sizes=sizes) @ np.array(self.forward) + self.pair_bytes * beyond))

    def backward_bytes(self, batch: int, imgsz: int, objects: int, sizes=None) -> int:
        """The loss's backward peak (bytes) above what was alive before the loss (the predictions' gradients
        included)."""
        return max(0, int(self.terms(batch, imgsz, objects, sizes=sizes) @ np.array(self.backward)))


def _tile_pixels(anchors: int, pixels: int) -> int:
    """The most anchor-pixels of one backward tile of the loss region's mask loss for an image of ``anchors``
    foreground anchors and ``pixels`` mask pixels (``yolo_ckpt.checkpointing.losses._MaskLoss.backward``): the
    coefficients' gradient in tiles of fewer than ``2 * ANCHOR_TILE`` anchors by all pixels, then the prototypes'
    in tiles of all anchors by ``k`` mask rows, ``k = anchors * pixels // PIXEL_TILE`` parts (at most half the rows): a
    tile under ``2 * PIXEL_TILE`` anchor-pixels plus one row's rounding, or three rows at most."""
    width = math.isqrt(pixels)  # square masks (imgsz / mask_ratio)
    by_anchors = min(anchors, 2 * ANCHOR_TILE - 1) * pixels
    by_rows = min(anchors * pixels, max(2 * PIXEL_TILE + anchors * width, 3 * anchors * width))
    return max(by_anchors, by_rows)


# Mask pixels SegTaskAlignedAssigner.pair_overlaps decodes per chunk of images (ultralytics/utils/tal.py line 482,
# mirrored; yolo_ckpt.checkpointing.assigner mirrors it too)
DECODE_CHUNK_PIXELS = 1 << 27


def _decoded(batch: int, anchors_per_image: int, pixels: int) -> int:
    """The most mask pixels that ``SegTaskAlignedAssigner.pair_overlaps`` (ultralytics/utils/tal.py) decodes at once
    when each image has at most ``anchors_per_image`` candidate anchors: it decodes the masks of as many images as fit
    its chunk of 2^27 mask pixels (at least one), so fewer candidates per image can mean more images per chunk. With
    ``m`` candidates in the largest image: ``m * pixels`` when that exceeds the chunk, else ``min(batch * m * pixels,
    2^27)``; the maximum over ``m <= anchors_per_image``."""
    most = anchors_per_image * pixels
    return max(most, min(batch * most, DECODE_CHUNK_PIXELS))


def _previous(batch: int, anchors_per_image: int, pixels: int) -> int:
    """The most mask pixels of a chunk that ``SegTaskAlignedAssigner.pair_overlaps`` decodes before another one (it
    keeps a chunk's decoded masks, ``pm`` and ``pmt``, until the next chunk's replace them): 0 where one chunk holds
    the whole batch whatever its images' candidates (``batch`` at most ``2^27 // (anchors_per_image * pixels)``), else
    the most of a chunk that leaves an image for the next, :func:`_decoded` of ``batch - 1`` images."""
    one_chunk = max(1, DECODE_CHUNK_PIXELS // max(anchors_per_image * pixels, 1))
    return 0 if batch <= one_chunk else _decoded(batch - 1, anchors_per_image, pixels)


_LOSS_MODELS: dict[str, LossModel] = {}  # per model YAML, class count, mask settings and amp


def _assigners(criterion) -> list:
    """The task-aligned assigners of a loss (one, or an end-to-end loss's one-to-many and one-to-one)."""
    parts = [getattr(criterion, n, None) for n in ("one2many", "one2one")] + [criterion]
    return [p.assigner for p in parts if p is not None and hasattr(p, "assigner")]


def _calibrate(model, amp: bool) -> LossModel:
    model.criterion = getattr(model, "criterion", None) or model.init_criterion()
    shape = LossModel(
        model_task(model),
        tuple(model.stride.tolist()),
        int(getattr(getattr(model, "args", None), "mask_ratio", 4)),
        tuple(min(a.topk, a.topk2) for a in _assigners(model.criterion)),
        (),
        (),
        getattr(model, "loss_chunk", None),
        tuple(3 * a.topk for a in _assigners(model.criterion) if isinstance(a, SegTaskAlignedAssigner)),
        getattr(model, "assign_chunk", None),
    )
    points = CALIBRATION_POINTS
    if shape.task in OBJECTLESS_TASKS:  # objects do not change their batch: each (batch, imgsz) once
        points = tuple(sorted({(b, s, 0) for b, s, _ in points}))
    pair_points = () if shape.task in OBJECTLESS_TASKS else PAIR_POINTS  # measured with the others: one prediction pass
    rows, forward, backward, pairs, assigned = _loss_samples(model, shape, points + pair_points, amp)
    n = len(points)
    rows, forward, backward, (few, many), pairs = rows[:n], forward[:n], backward[:n], assigned[n:] or (0, 0), pairs[n:] or (0, 0)
    fit = lambda y, lower=None: _fit(rows, np.array(y, float), upper=shape.task == "segment", lower=lower)  # noqa: E731
    # the decoding's bytes per mask pixel are the code's, not the fit's: its points decode too few pixels to tell them
    decoding = [0.0] * (rows.shape[1] - 1) + [DECODED_BYTES_PER_PIXEL] if shape.mask_topk else None  # the last term
    forward, backward = fit(forward, decoding), fit(backward)
    if shape.task == "segment":  # the mask-pixel terms (from the 5th on) carry the extrapolation margin
        forward, backward = (c[:4] + tuple(v * (1 + MASK_TERMS_MARGIN) for v in c[4:]) for c in (forward, backward))
    pair_bytes = max(0.0, (many - few) / max(pairs[1] - pairs[0], 1))  # the bytes of a pair beyond the fitted ones
    return dataclasses.replace(shape, forward=forward, backward=backward, pair_bytes=pair_bytes)


def _fit(rows: np.ndarray, y: np.ndarray, upper: bool, lower=None) -> tuple[float, ...]:
    """Coefficients (one per column of ``rows``, samples x terms) of the loss formula fitted to ``y`` (bytes): least
    squares, or with ``upper`` an upper bound of every sample (coefficients at least ``lower``, one per term, else 0;
    ``rows @ c >= y``; the least total relative over-estimate: a linear program, ``scipy.optimize.linprog``).

    Raises:
        RuntimeError: when the linear program has no solution (it has one whenever a term is constant).
    """
    if not upper:
        return tuple(float(c) for c in np.linalg.lstsq(rows, y, rcond=None)[0])
    from scipy.optimize import linprog  # here: scipy.optimize takes ~1 s to import and only a calibration fits

    bounds = [(low, None) for low in (lower or [0.0] * rows.shape[1])]
    fit = linprog((rows / np.maximum(y, 1)[:, None]).sum(0), A_ub=-rows, b_ub=-y, bounds=bounds, method="highs")
    if not fit.success:
        raise RuntimeError(f"the loss calibration's fit failed: {fit.message}")
    return tuple(float(c) for c in fit.x)


def _loss_samples(model, shape: LossModel, points, amp: bool) -> tuple[np.ndarray, list[int], list[int], list[int], list[int]]:
    """CPU measurements of ``model``'s real loss at ``points`` (batch, imgsz, objects, and optionally the boxes' sides
    (lo, hi) as fractions of the image, else grid-laid: :func:`~yolo_ckpt.memory.training_batch.training_batch`): the formula's
    terms (with the measured foreground anchors), the loss's forward and backward peaks above what was alive before it,
    the candidate pairs of its assigner, and the assigner's own peak above what was alive when it started (the most of
    its assigners')."""
    g = torch.Generator().manual_seed(0)
    stride = int(max(model.stride.tolist()))
    points = [(batch, max(imgsz // stride, 1) * stride, objects, *sides) for batch, imgsz, objects, *sides in points]
    specs = _prediction_specs(model, sorted({imgsz for _, imgsz, *_ in points}), amp)
    rows, forward, backward, pairs, assigned = [], [], [], [], []
    for batch, imgsz, objects, *sides in points:
        # Random predictions of the model's shapes and dtypes: the loss's memory depends on shapes and targets, not
        # on the values, so no real forward pass is needed, whatever the model's size.
        preds = tree_map(
            lambda s, batch=batch: torch.rand(batch, *s[0], generator=g).to(s[1]).requires_grad_(), specs[imgsz], is_leaf=_is_spec
        )
        data = training_batch(model, batch, imgsz, objects, sides=sides[0] if sides else None)
        fg, calls, inside, live = [], [], [], {}

        def enter(module, args, kwargs, live=live, calls=calls):  # the assigner's own peak: above what is alive when it starts
            live["tracker"].mark()
            live["entry"] = live["tracker"].live_bytes
            calls.append((module, *_targets(module, args, kwargs)))

        def leave(module, args, out, live=live, fg=fg, inside=inside):
            fg.append(out[3].sum(1))
            inside.append(live["tracker"].mark() - live["entry"])

        hooks = [a.register_forward_pre_hook(enter, with_kwargs=True) for a in _assigners(model.criterion)]
        hooks += [a.register_forward_hook(leave) for a in _assigners(model.criterion)]
        try:
            with LiveTensorTracker() as tracker, cuda_amp_emulated(amp) as autocast:  # the tracker sees its fp32 copies
                live["tracker"] = tracker
                tracker.track(preds, data)  # views of them are not new memory
                before = tracker.start_phase()
                with autocast():
                    loss = model.loss(data, preds)[0].sum()
                forward.append(tracker.phase_peak_bytes - before)
                tracker.start_phase()
                loss.backward()
                backward.append(tracker.phase_peak_bytes - before)
        finally:
            for h in hooks:
                h.remove()
        del loss, preds
        per_image = torch.stack(fg) if fg else torch.zeros(1, batch)  # (assigners, images)
        rows.append(shape.terms(batch, imgsz, objects, (int(per_image.sum()), int(per_image.max()))))
        pairs.append(max((candidate_pairs(*call, imgsz, model.stride.tolist()) for call in calls), default=0))
        assigned.append(max(inside, default=0))
        del calls
    return np.array(rows), forward, backward, pairs, assigned


def _targets(assigner, args: tuple, kwargs: dict) -> tuple:
    """An assigner call's targets, ``gt_bboxes`` and ``mask_gt`` (the loss holds them while it runs; a reference to
    the scores and boxes it makes for the assigner would keep them alive into the measurement), to count its candidate
    pairs after the measurement (:func:`~yolo_ckpt.memory.foreground.candidate_pairs`)."""
    call = inspect.signature(type(assigner).forward).bind(assigner, *args, **kwargs).arguments
    return call["gt_bboxes"], call["mask_gt"]


_PREDICTION_SPECS: dict[tuple, dict] = {}  # per model (estimate_cache.model_key), sizes and amp, in this process


def _prediction_specs(model, sizes: list[int], amp: bool) -> dict:
    """Per imgsz in ``sizes``, the shapes (at one image: all are batch-first) and dtypes of ``model``'s training
    predictions. A fake pass costs the same at any size (its cost is per op), so the whole model runs once, at the
    first size, and the head alone at the others, on its inputs rescaled: each is a feature map at a fixed stride.
    Kept per model, sizes and amp in this process: the loss region's calibration (:func:`yolo_ckpt.memory.composed.loss_models`
    calibrates a copy with and one without it) changes the loss, not the predictions, and need not pass again."""
    key = (estimate_cache.model_key(model), getattr(model.model[-1], "end2end", None), tuple(sizes), amp)
    if key not in _PREDICTION_SPECS:
        _PREDICTION_SPECS[key] = _fake_prediction_specs(model, sizes, amp)
    return _PREDICTION_SPECS[key]


def _fake_prediction_specs(model, sizes: list[int], amp: bool) -> dict:
    with fake_copy(model) as (fake_mode, fake):
        head, first, inputs = fake.model[-1], sizes[0], []
        hook = head.register_forward_pre_hook(lambda m, args: inputs.append(args))

        def at(size):  # the head's inputs at another imgsz: (1, C, H, W) with H, W in proportion
            return lambda t: (
                t.new_empty(*t.shape[:2], *(d * size // first for d in t.shape[2:])) if isinstance(t, torch.Tensor) and t.dim() == 4 else t
            )

        spec = lambda out: tree_map(lambda t: (t.shape[1:], t.dtype), out)  # noqa: E731
        with fake_mode, torch.no_grad(), cuda_amp_emulated(amp) as autocast, autocast():
            try:
                specs = {first: spec(fake(torch.empty(1, 3, first, first)))}
            finally:
                hook.remove()
            specs.update({size: spec(head(*tree_map(at(size), inputs[0]))) for size in sizes[1:]})
    return specs


def _is_spec(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], torch.Size)


def calibrate_loss(model, amp: bool = False) -> LossModel:
    """Fit the loss formula of ``model`` (any task of :data:`~yolo_ckpt.memory.ultralytics_rules.TASKS`, any ``nc``) to CPU
    measurements of its real loss, as ``model.loss`` computes it (with the loss region where one is applied:
    ``model.loss_chunk``, ``model.assign_chunk``), at :data:`CALIBRATION_POINTS` (a few seconds for a nano model); cached per model YAML,
    class count, mask settings, loss region and ``amp``, in this process and on disk (:mod:`yolo_ckpt.memory.estimate_cache`).

    Raises:
        ValueError: for a task that is not modelled.
    """
    args = getattr(model, "args", None)
    settings = (
        getattr(args, "overlap_mask", None), getattr(args, "mask_ratio", None), getattr(model, "loss_chunk", None),
        getattr(model, "assign_chunk", None),
    )
    key = repr((estimate_cache.architecture(model), getattr(model.model[-1], "nc", None), settings, amp))
    if key not in _LOSS_MODELS:
        stored = estimate_cache.load("loss", key)  # an earlier process's calibration of the same code and model
        if stored is None:
            _LOSS_MODELS[key] = _calibrate(model, amp)
            estimate_cache.store("loss", key, dataclasses.asdict(_LOSS_MODELS[key]))
        else:
            _LOSS_MODELS[key] = LossModel(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
    return _LOSS_MODELS[key]


# model -> (its layout, the fake mode, the fake copy, the copy's attributes): one fake copy per model, reused by every
# fake pass of it (the copy is a third of a pass's time on a nano model; a plan makes a dozen passes of one model)
_FAKE_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SCALARS = (bool, int, float, str, type(None))


def _layout(model: torch.nn.Module) -> tuple:
    """What a fake copy of ``model`` is made of: its modules' classes and plain attributes (flags such as a head's
    ``end2end``) and its tensors' names, shapes, dtypes and ``requires_grad`` (``freeze=``)."""
    return (
        tuple((type(m), tuple((k, v) for k, v in vars(m).items() if isinstance(v, _SCALARS))) for m in model.modules()),
        tuple((n, t.shape, t.dtype, t.requires_grad) for n, t in (*model.named_parameters(), *model.named_buffers())),
    )


def _attributes(model: torch.nn.Module) -> list:
    """Every module's class, attributes (plain values, else the object's identity), tensors' identities and hooks: a
    fake pass that leaves these as it found them leaves nothing behind that the next pass could see (a cached
    anchor grid, a hook, a gradient)."""
    return [
        (type(m), {k: v if isinstance(v, _SCALARS) else id(v) for k, v in vars(m).items()},
         {k: id(v) for k, v in m._parameters.items()}, {k: id(v) for k, v in m._buffers.items()},
         len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks), len(m._backward_pre_hooks))
        for m in model.modules()
    ] + [p.grad is None for p in model.parameters()]


@contextlib.contextmanager
def fake_copy(model: torch.nn.Module):
    """``(FakeTensorMode, fake copy of model)``: ``model`` copied onto fake tensors (``FakeCopyMode``: shapes, dtypes
    and storages, no data) in training mode, with no policy applied. The copy is kept per model and reused while the
    model's layout (:func:`_layout`) stays the same; after each use its policy is removed and its gradients dropped,
    and a use that left anything else behind (a new attribute, a hook) discards it, so every pass starts from a copy
    as a fresh ``deepcopy`` makes it."""
    layout = _layout(model)
    kept = _FAKE_COPIES.pop(model, None)
    if kept is not None and kept[0] == layout:
        _, fake_mode, fake, attributes = kept
    else:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        with FakeCopyMode(fake_mode):
            fake = copy.deepcopy(model).train()
        remove_checkpointing(fake)
        attributes = _attributes(fake)
    yield fake_mode, fake
    remove_checkpointing(fake)
    for p in fake.parameters():
        p.grad = None
    if _attributes(fake) == attributes:  # not on an exception (it skips this): that copy is dropped
        _FAKE_COPIES[model] = (layout, fake_mode, fake, attributes)


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
        loss_model: the loss formula; when None :func:`calibrate_loss` of ``model``, or where ``recompute`` applies
            the loss region (``yolo_ckpt.checkpointing.losses``), of a copy of ``model`` with it applied.
        flops: count per-layer forward FLOPs (a second fake forward pass).
        optimizer_from: an earlier estimate of the same model and optimizer (any policy, batch and imgsz) whose
            optimizer phase and state this one takes instead of running the step (a quarter of a pass's time):
            that phase holds the parameters, buffers, gradients, optimizer state and the batch, so it differs
            between the two only by their batches' bytes (``input_bytes``).
        sizes: the training set's :class:`~yolo_ckpt.memory.foreground.ObjectSizes`, which bound a segmentation loss's
            foreground anchors by its boxes' sizes (:meth:`LossModel.foreground`); None: ``objects * topk`` per image.

    Returns:
        A :class:`~yolo_ckpt.memory.step.StepProfile` with ``source="fake_estimate"`` and ``imgsz`` the trained size.

    Raises:
        ValueError, TypeError: for a task that is not modelled, an unknown optimizer or an invalid imgsz.
    """
    imgsz = train_imgsz(imgsz, model.stride)
    with fake_copy(model) as (fake_mode, fake):
        policy = apply_checkpointing(fake, recompute, mode=mode)
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

                def stand_in_loss(preds):  # dense gradients of the predictions' shapes, as the real loss gives
                    fwd_end[0] = tracker.live_bytes
                    return sum((t.float() * t.float()).sum() for t in tree_leaves(preds) if isinstance(t, torch.Tensor))

                fwd_end = [0]
                peaks, _, state = run_step(fake, data, opt, stand_in_loss, tracker, autocast)
            accounting.remove()
        inputs = tensor_bytes(data)
        if optimizer_from is not None:  # its state: its static bytes less its parameters, buffers and batch (as ours)
            earlier = optimizer_from
            state = earlier.static_bytes - earlier.input_bytes - (static - inputs)
            peaks = {p: v + state for p, v in peaks.items()} | {
                "optimizer": earlier.phase_peak_bytes["optimizer"] - earlier.input_bytes + inputs
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
        network, loss_model.forward_bytes(batch, imgsz, objects, sizes), loss_model.backward_bytes(batch, imgsz, objects, sizes)
    )


def with_loss_phases(step: StepProfile, forward: int, backward: int) -> StepProfile:
    """``step``, a fake pass whose loss holds nothing (its ``loss`` phase is the forward's end: a stand-in loss, or
    a formula of zeros), with the loss's peaks on top: ``forward`` bytes (the loss's forward peak above what was
    alive before it) in the loss phase, and in the backward phase the loss's own backward, ``backward`` bytes above
    the forward's end, which runs before the model's (whose peak the stand-in's backward gives; the loss's saved
    tensors are freed by then). ``loss_bytes`` becomes ``forward``. Used by :func:`estimate_step` and by
    :meth:`yolo_ckpt.memory.composed.ComposedEstimate.estimate`, which composes each policy's loss on one pass of its layers."""
    end = step.phase_peak_bytes["loss"]
    phases = step.phase_peak_bytes | {"loss": end + forward, "backward": max(step.phase_peak_bytes["backward"], end + backward)}
    return dataclasses.replace(step, phase_peak_bytes=phases, loss_bytes=forward, peak_bytes=max(phases.values()))
