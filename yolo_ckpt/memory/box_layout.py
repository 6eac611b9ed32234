"""The most anchors one augmented training sample's objects can claim, from where the labels' boxes lie.

The assigner's memory grows with two counts (:class:`yolo_ckpt.memory.loss_model.LossModel`): its candidate pairs
(an object and an anchor whose centre is in its box) and, for segmentation, its foreground anchors (at most ``topk``
per object). Bounding each object at its worst place on the anchor grid (:func:`yolo_ckpt.memory.foreground.box_anchors`)
over-counts dense data twice: the objects of one image move on the grid together, so they cannot all sit at their
worst place at once; and a mosaic at a small scale holds every object of four images, but at a large one shows only
a part of them. Here, for Ultralytics' axis-aligned augmentation (``degrees=0``, ``shear=0``, ``perspective=0``; with
or without ``Mosaic``; ``RandomPerspective``'s scale ``s`` in its range and any translation, ``ultralytics/data/
augment.py`` lines 480-560 and 1130-1260):

- **alignment** (:func:`_aligned`): one image's boxes at scale ``s``, shifted by ``o`` (the mosaic's placement and
  the affine's translation together, any value), hold per anchor level ``cx(o_x) * cy(o_y)`` anchors each, and each
  axis's count takes one of two values as ``o`` moves (an interval of fixed length holds ``floor`` or ``ceil`` of
  length / stride lattice points). The image's sum of ``min(cap, sum over levels)`` over every ``o`` on a grid of
  :data:`OFFSET_STEP` px within the grid's period is then one product of two matrices (per object, a table of its
  ``2^levels x 2^levels`` states). Each box is its hull over the cell of offsets and the interval of scales, so the
  grid's maximum bounds every offset and scale in between; boxes are floored at ``stride_val`` as
  ``select_candidates_in_gts`` floors them (lines 346-351 of ``ultralytics/utils/tal.py``), and counted with the
  lattice points outside the image: a box the affine clips at the border, and the assigner then floors, holds no
  more per axis than the unclipped box does there.
- **visibility** (:class:`_Sample`): at scale ``s`` the output shows a ``imgsz / s`` square of the mosaic's canvas,
  split by the mosaic's centre among the four images, each showing a window of itself. Per window size, the most any
  window of an image holds (the objects whose boxes can meet it, each at its worst place; in cells of
  ``imgsz / CELLS``, an object larger than most counted in every window), at most its whole alignment bound. A
  quadrant may take any image (the mosaic may draw one image four times), so the sample's bound is the largest sum
  over the four quadrants, for every split of the square (in steps of ``imgsz / SPLIT_STEPS``).

The largest over the scale range is found by branch and bound on intervals of ``s`` (:func:`most_per_sample`): an
interval's bound holds for every scale in it, and the interval whose bound is largest is split until its boxes move
by at most :data:`DRIFT` px within it. Never under the assigner (``tests/memory/test_box_layout.py``: Ultralytics'
own mosaics, and crafted layouts, on the real assigner).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from . import estimate_cache
from .ultralytics_rules import stride_val

OFFSET_STEP = 0.5  # px: the offset grid's step (each box is widened by it: its hull over a cell of offsets)
DRIFT = 0.25  # px: the most a box moves within a scale interval that is not split further
CELLS = 32  # cells per image side for the windows a mosaic quadrant shows
SPLIT_STEPS = 32  # steps per image side of the split of the output among the mosaic's quadrants
WINDOW_IMAGES = 32  # the densest images whose windows are summed (the others: each its whole worst sum)
ALIGN_WIDTH = 4.0  # px: the alignment bound is computed for scale intervals whose boxes move less than this
REACH = 0.99  # the quantile of the objects' half sides by which a window reaches out (larger ones: every window)
SPLITS = 40  # the most scale intervals split: past it the largest interval bound stands
GAP = 0.02  # splitting stops once the largest interval bound is within this of a narrowest interval's
_ROUNDING = 1e-3  # strides: the assigner's float32 in-box test can admit a lattice point this close to an edge


def _lattice(lo: np.ndarray, hi: np.ndarray, stride: float) -> np.ndarray:
    """Anchor centres ``(k + 1/2) * stride`` (any integer k) strictly inside ``(lo, hi)``, with :data:`_ROUNDING`."""
    e = _ROUNDING * stride
    return np.maximum(0.0, np.ceil((hi + e) / stride - 0.5) - 1 - np.floor((lo - e) / stride - 0.5))


def _hull(centre, side, scales, strides, rounding) -> tuple[np.ndarray, np.ndarray]:
    """Each box's hull (lo, hi: px from its image's centre) along one axis over the scale interval ``scales``: its
    side at the interval's top, floored at ``stride_val``, around its centre anywhere in the interval. ``centre``
    (px at scale 1, from the image's centre), ``side`` (px at scale 1), ``rounding`` (px each end may gain from
    ``load_image``'s rounding)."""
    lo_s, hi_s = scales
    half = np.maximum(stride_val(strides), hi_s * side) / 2 + rounding * hi_s
    return np.minimum(lo_s * centre, hi_s * centre) - half, np.maximum(lo_s * centre, hi_s * centre) + half


def _axis_counts(lo, hi, strides) -> np.ndarray:
    """Per offset of the grid (rows), box and level: the anchors along one axis in the hull (``lo``, ``hi``) shifted
    by any offset in the grid's cell (offsets, boxes, levels)."""
    offsets = np.arange(0.0, max(map(float, strides)), OFFSET_STEP)[:, None]
    return np.stack([_lattice(lo + offsets, hi + offsets + OFFSET_STEP, float(s)) for s in strides], -1)


def _worst(lo, hi, strides) -> np.ndarray:
    """The most anchors along one axis the hull (``lo``, ``hi``) holds at any offset (boxes, levels): an interval of
    length l holds at most ceil(l / stride) lattice points."""
    length = hi - lo + OFFSET_STEP
    return np.stack([np.ceil(length / float(s) + 2 * _ROUNDING) for s in strides], -1)


def _box_most(side, scales, strides, rounding) -> np.ndarray:
    """The most anchors along one axis one box holds wherever it lies (boxes, levels), whatever the hull over
    offsets and scales adds: a box of side ``side`` (px at scale 1) at a scale up to ``scales[1]``, its ends moved
    by up to ``rounding`` px (``load_image``), is at most ``l = scales[1] * (side + 2 * rounding)`` long, and an
    interval of length l holds at most ``ceil(l / stride)`` lattice points (:data:`_ROUNDING` more, as
    :func:`_lattice`). A box shorter than ``stride_val`` is exactly ``stride_val`` long in the assigner
    (``select_candidates_in_gts`` sets its side to it, then ``xywh2xyxy`` makes its ends ``x -+ stride_val / 2``
    from one float32 centre x): rounding cannot admit a point past either end (an anchor centre a is representable,
    so ``fl(x - stride_val / 2) < a`` needs ``x - stride_val / 2 < a``), so it holds at most
    ``ceil(stride_val / stride)``, which the hull, half a pixel wider (:data:`OFFSET_STEP`), exceeds where
    ``stride_val`` is a whole number of strides: every small object of dense data counted one anchor wider per
    axis."""
    sv, length = stride_val(strides), scales[1] * (side + 2 * rounding)
    return np.stack([np.where(length < sv, np.ceil(sv / float(s)), np.ceil(length / float(s) + 2 * _ROUNDING)) for s in strides], -1)


def _tables(cx: np.ndarray, cy: np.ndarray, cap: float):
    """Each object's count as a table of its axis states: (objects, 2^levels, 2^levels) with ``min(cap, sum over
    levels of (bx + x_state) * (by + y_state))``; and the states per offset (offsets, objects), for ``cx``, ``cy``
    (offsets, objects, levels) from :func:`_axis_counts`."""
    levels = cx.shape[-1]
    bits = (np.arange(2**levels)[:, None] >> np.arange(levels)) & 1  # (states, levels)
    bx, by = cx.min(0), cy.min(0)  # (objects, levels): each count is this or one more
    weights = 1 << np.arange(levels)
    sx, sy = ((cx - bx) * weights).sum(-1).astype(int), ((cy - by) * weights).sum(-1).astype(int)
    table = np.einsum("nsl,ntl->nst", bx[:, None] + bits, by[:, None] + bits)
    return np.minimum(cap, table), sx, sy


def _aligned(table: np.ndarray, sx: np.ndarray, sy: np.ndarray) -> float:
    """The most one image's objects hold together at one offset: max over (o_x, o_y) of
    ``sum_j table[j, sx[o_x, j], sy[o_y, j]]``, one product of two matrices (a row per offset, a column per object
    state)."""
    offsets, n = sx.shape
    states = table.shape[-1]
    rows = table[np.arange(n), sx]  # (offsets_x, objects, states): each object's row at its x state
    onehot = np.zeros((offsets, n, states))
    onehot[np.arange(offsets)[:, None], np.arange(n), sy] = 1
    return float((rows.reshape(offsets, -1) @ onehot.reshape(offsets, -1).T).max())


class _Sample:
    """One dataset's objects for :func:`most_per_sample` (arrays as :class:`yolo_ckpt.memory.foreground.ObjectSizes`
    holds them), at one imgsz, strides and cap."""

    def __init__(self, sizes, imgsz: int, strides, cap: float):
        self.sizes, self.imgsz, self.strides, self.cap = sizes, imgsz, tuple(map(float, strides)), cap
        self.images = int(sizes.extent.shape[0])
        ext = sizes.extent[sizes.image]  # each object's image sides, fractions of the long side
        self.centre = ((sizes.x - ext[:, 0] / 2) * imgsz, (sizes.y - ext[:, 1] / 2) * imgsz)
        # load_image resizes the short side to ceil(short * r): up to 1 px more, so a point moves up to 1/2 px
        self.rounding = np.where(ext.min(1) < 1, 0.5, 0.0)
        # a window meets an object whose centre is up to its half side (px at scale 1) outside it: the windows reach
        # out by the REACH quantile of the half sides, and an object larger than that is counted in every window
        half = np.maximum(sizes.w, sizes.h) * imgsz / 2
        self.reach = float(np.quantile(half, REACH)) if len(half) else 0.0
        col = np.clip((sizes.x * CELLS).astype(int), 0, CELLS - 1)
        row = np.clip((sizes.y * CELLS).astype(int), 0, CELLS - 1)
        self.cell = np.where(half > self.reach, CELLS * CELLS, row * CELLS + col)  # CELLS^2: in every window
        self.cell_px = imgsz / CELLS

    def cells(self, extent: float) -> int:
        """Cells per side whose objects' centres hold every object (but the large) that can meet a window of
        ``extent`` canvas px (at most an image's side), wherever the window lies."""
        return int(min(CELLS, math.ceil((min(extent, self.imgsz) + 2 * self.reach) / self.cell_px - 1e-9) + 1))

    def bound(self, scales: tuple[float, float], mosaic: bool) -> float:
        """The most one sample holds for every scale in ``scales``."""
        s, n = self.sizes, self.images
        x = _hull(self.centre[0], s.w * self.imgsz, scales, self.strides, self.rounding)
        y = _hull(self.centre[1], s.h * self.imgsz, scales, self.strides, self.rounding)
        most_x = _box_most(s.w * self.imgsz, scales, self.strides, self.rounding)
        most_y = _box_most(s.h * self.imgsz, scales, self.strides, self.rounding)
        worst_x, worst_y = np.minimum(_worst(*x, self.strides), most_x), np.minimum(_worst(*y, self.strides), most_y)
        worst = np.minimum(self.cap, (worst_x * worst_y).sum(-1))  # anywhere
        whole = np.bincount(s.image, weights=worst, minlength=n)
        # the densest images by their worst sum: the windows of the others hold no more than their whole
        top = np.argsort(-whole)[:WINDOW_IMAGES]
        rest = float(np.delete(whole, top).max(initial=0))
        index = np.full(n, -1)
        index[top] = np.arange(len(top))
        mine = index[s.image] >= 0
        grid = np.zeros((CELLS * CELLS + 1, len(top)))
        np.add.at(grid, (self.cell[mine], index[s.image[mine]]), worst[mine])
        prefix = np.pad(grid[:-1].reshape(CELLS, CELLS, -1), ((1, 0), (1, 0), (0, 0))).cumsum(0).cumsum(1)
        whole, aligned = whole[top], np.zeros(len(top), bool)
        align = scales[1] - scales[0] <= ALIGN_WIDTH / (self.imgsz / 2)  # boxes that move less than ALIGN_WIDTH px

        def most(i: int, j: int) -> float:  # the most one image shows in a window of i x j cells (rows, columns)
            window = prefix[i:, j:] - prefix[:-i, j:] - prefix[i:, :-j] + prefix[:-i, :-j]
            values = np.minimum(whole, window.max((0, 1)) + grid[-1])
            while align and not aligned[k := int(values.argmax())] and values[k] > rest:  # the one holding the most
                objects = s.image == top[k]
                cx = np.minimum(_axis_counts(x[0][objects], x[1][objects], self.strides), most_x[objects])
                cy = np.minimum(_axis_counts(y[0][objects], y[1][objects], self.strides), most_y[objects])
                whole[k] = min(whole[k], _aligned(*_tables(cx, cy, self.cap)))
                aligned[k] = True
                values[k] = min(values[k], whole[k])
            return max(float(values.max(initial=0)), rest)

        return self._combine(most, scales[0], mosaic)

    def _combine(self, most, low: float, mosaic: bool) -> float:
        """The largest sum over the quadrants a window of ``imgsz / low`` canvas px shows (one quadrant without
        mosaic), each at most one image's side; ``most(i, j)``: the most one image shows in i x j cells."""
        side = self.imgsz / max(low, 1e-6)  # canvas px the output shows
        if not mosaic:
            return most(self.cells(side), self.cells(side))
        # one quadrant's extent along an axis is in [side - imgsz, imgsz] (at most an image's side): in steps,
        # each quadrant at the step's larger extent
        step = self.imgsz / SPLIT_STEPS
        first = min(max(0.0, side - self.imgsz), float(self.imgsz))
        splits = np.arange(first, max(first, min(side, self.imgsz)) + 1e-9, step)
        parts = np.array(sorted({(self.cells(min(a + step, side)), self.cells(side - a)) for a in splits}))
        cells = np.unique(parts)
        held = np.zeros((CELLS + 1, CELLS + 1))
        for i in cells:
            for j in cells:
                held[i, j] = most(int(i), int(j))
        (a1, a2), (b1, b2) = parts.T[:, None, :], parts.T[:, :, None]  # every split of the columns, then of the rows
        return float((held[b1, a1] + held[b1, a2] + held[b2, a1] + held[b2, a2]).max())


def most_per_sample(sizes, imgsz: int, strides, cap: float, scales: tuple[float, float], mosaic: bool) -> int:
    """The most anchors (each object's candidates, at most ``cap`` per object) one training sample of ``sizes``'
    objects can hold at ``imgsz``, over ``RandomPerspective`` scales in ``scales`` (low, high), with ``Mosaic`` or
    without; before any augmentation that adds images (mixup, copy-paste: the caller's factors).

    Args:
        sizes: :class:`yolo_ckpt.memory.foreground.ObjectSizes` with the objects' centres (``x``, ``y``) and their
            images' sides (``extent``), fractions of the long side.
        imgsz: the size the step trains at (pixels); strides: the head's strides (pixels).
        cap: the most one object claims (``topk`` for foreground; the grid's anchors for candidate pairs).

    Returns: the bound, an int. Branch and bound over intervals of scale (module docstring): the interval with the
    largest bound is split until its boxes move by at most :data:`DRIFT` px in it, or it is within :data:`GAP` of the
    narrowest interval's bound seen, or after :data:`SPLITS` splits. Kept across processes by the estimate cache
    (:mod:`yolo_ckpt.memory.estimate_cache`): a plan asks again for the same data and imgsz."""
    if not len(sizes.image):
        return 0
    key = (sizes.key, imgsz, tuple(map(float, strides)), float(cap), tuple(map(float, scales)), mosaic)
    stored = estimate_cache.load("layout", key)
    if stored is not None:
        return int(stored["most"])
    most = _branch_and_bound(_Sample(sizes, imgsz, strides, cap), imgsz, scales, mosaic)
    estimate_cache.store("layout", key, {"most": most})
    return most


def _branch_and_bound(sample: _Sample, imgsz: int, scales: tuple[float, float], mosaic: bool) -> int:
    """:func:`most_per_sample`'s search over the scale interval ``scales``."""
    low, high = max(scales[0], 1e-3), max(scales[1], 1e-3)
    finest = DRIFT / (imgsz / 2)  # a box at most imgsz/2 from its image's centre moves s * this per unit of s

    def entry(lo: float, hi: float):
        return (-sample.bound((lo, hi), mosaic), lo, hi)

    edges = np.linspace(low, high, 9) if high > low else np.array([low, high])
    heap = [entry(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]
    heapq.heapify(heap)
    near = 0.0  # the largest bound of a narrowest interval seen: the top cannot get much below it
    for _ in range(SPLITS):  # the top of the heap bounds every interval: stopping early only leaves it looser
        value, lo, hi = heap[0]
        if hi - lo <= finest or -value <= near * (1 + GAP):
            break
        heapq.heappop(heap)
        mid = (lo + hi) / 2
        near = max(near, -entry(mid - finest / 2, mid + finest / 2)[0])
        heapq.heappush(heap, entry(lo, mid))
        heapq.heappush(heap, entry(mid, hi))
    return int(math.ceil(-heap[0][0] - 1e-6))
