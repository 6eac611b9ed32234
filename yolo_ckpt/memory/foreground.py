"""Foreground anchors: what the task-aligned assigner gives (measured), and the bound the loss formula takes.

A segmentation loss's memory grows with its foreground anchors (the anchors the assigner makes positive:
:class:`yolo_ckpt.memory.loss_model.LossModel`'s ``Fb`` and ``F1`` terms). :func:`measured_foreground` counts them on a
real batch, per assigner and image (the ``fg_mask`` of Ultralytics' ``TaskAlignedAssigner.forward``,
``ultralytics/utils/tal.py``).

The bound: an anchor is a candidate of an object only if its centre lies in the object's box
(``select_candidates_in_gts``), and each object keeps at most ``topk`` of its candidates. From the training set's
labels (:func:`object_sizes`) each box is taken at the largest size the run's augmentation can give it
(:func:`augmented_sides`), and holds at most :func:`box_anchors` anchors wherever it lies on the anchor grid;
:meth:`ObjectSizes.per_image` sums ``min(topk, box_anchors)`` over the densest image, times the images one augmented
sample holds. Never under the assigner's foreground, whatever the predictions (``tests/memory/test_foreground.py``).
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from .box_layout import most_per_sample
from .ultralytics_rules import largest_scale, mosaic, scale_range, stride_val


def measured_foreground(model, batch: dict) -> torch.Tensor:
    """The foreground anchors (``fg_mask.sum``) each task-aligned assigner of ``model``'s loss gives each image of
    ``batch``, on the predictions of a copy of ``model`` in training mode: an int64 tensor (assigners, images)."""
    from ..checkpointing.assigner import assigners

    probe = copy.deepcopy(model).train()  # training mode updates BatchNorm statistics: not the caller's
    probe.criterion = probe.init_criterion()
    counts = []
    hooks = [a.register_forward_hook(lambda m, args, out: counts.append(out[3].sum(1))) for a in assigners(probe.criterion)]
    try:
        with torch.no_grad():
            probe.loss(batch, probe(batch["img"]))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(counts) if counts else torch.zeros(0, len(batch["img"]), dtype=torch.int64)


def candidates(assigner, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor, imgsz: int, strides) -> torch.Tensor:
    """Which anchors are candidates of which objects (anchor centre in the box: ``select_candidates_in_gts`` of the
    valid objects, ``ultralytics/utils/tal.py``) for a task-aligned ``assigner`` given ``gt_bboxes`` (b, n, 4 or 5,
    pixels) and ``mask_gt`` (b, n, 1) as the loss passes them, on the anchor grid of a square ``imgsz`` at ``strides``
    (``make_anchors`` x stride); pose's pyramid-level gate included. Returns a bool tensor (b, n, anchors)."""
    from ultralytics.utils.tal import make_anchors

    stride = torch.tensor([float(s) for s in strides])
    points, per_anchor = make_anchors([torch.empty(1, 1, imgsz // int(s), imgsz // int(s)) for s in stride.tolist()], stride)
    if hasattr(assigner, "anc_strides"):  # PoseTaskAlignedAssigner.forward sets it for its gate
        assigner.anc_strides = per_anchor.view(-1)
    return assigner.select_candidates_in_gts(points * per_anchor, gt_bboxes, mask_gt).bool() & mask_gt.bool()


def candidate_pairs(assigner, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor, imgsz: int, strides) -> int:
    """The candidate pairs (object, anchor whose centre is in its box) of :func:`candidates`: the pairs the
    task-aligned assigner computes its overlaps for."""
    return int(candidates(assigner, gt_bboxes, mask_gt, imgsz, strides).sum())


AUGMENT_KEYS = ("scale", "degrees", "shear", "perspective", "multi_scale")  # the run's keys that change a box's size

# Per axis, a few thousandths of a stride more than the box's side: the assigner's in-box test runs on float32
# coordinates that xyxy2xywh/xywh2xyxy round (ulps of the pixel coordinate, 1e-4 px at 1024 px), so a side that is a
# whole number of strides could hold one more anchor than the exact geometry gives.
_ROUNDING = 1e-3


def box_anchors(w: np.ndarray, h: np.ndarray, strides, rotated: bool = False) -> np.ndarray:
    """The most anchor points (all levels) whose centre can lie in an object's box of ``w`` x ``h`` pixels, at any
    position: each side first floored at :func:`stride_val` as ``select_candidates_in_gts`` floors it
    (``ultralytics/utils/tal.py`` lines 346-351, and 515-520 for the rotated assigner).

    - axis-aligned (detect, segment, pose: an anchor is in the box when it is strictly inside, lines 354-358): at
      stride s, at most ceil(w / s) anchors across and ceil(h / s) down; pose's pyramid-level gate only removes some;
    - ``rotated`` (obb, ``RotatedTaskAlignedAssigner``: a closed rectangle, lines 522-534, whose sides are those of
      the minimum-area rectangle of the object's corners after augmentation, clipped at the image's border): a convex
      set of area A and perimeter P holds at most A + P/2 + 1 points of a square lattice of unit spacing (Nosarzewska,
      1948), (w/s + 1)(h/s + 1) for a w x h rectangle at any angle. ``w``, ``h`` are the unclipped rectangle's: a
      clipped part's minimum-area rectangle has area at most w*h and sides at most its diagonal D, and the bound over
      those is the larger of a square of that area and a D x wh/D rectangle.

    Returns: float64 counts, one per box."""
    sv = stride_val(strides)
    if rotated:
        area, diagonal = w * h, np.hypot(w, h)
        shapes = ((np.sqrt(area), np.sqrt(area)), (diagonal, area / np.maximum(diagonal, 1e-9)))
        return np.maximum(*(_lattice_points(a, b, strides, sv) for a, b in shapes))
    total = np.zeros(np.shape(w))
    for s in map(float, strides):
        across = np.where(w > sv, np.ceil(w / s + _ROUNDING), np.ceil(sv / s))  # a floored side is exactly sv
        down = np.where(h > sv, np.ceil(h / s + _ROUNDING), np.ceil(sv / s))
        total += across * down
    return total


def _lattice_points(w, h, strides, sv: float) -> np.ndarray:
    """Nosarzewska's bound, summed over strides, for rectangles of sides ``w``, ``h`` floored at ``sv``."""
    w, h = np.maximum(w, sv), np.maximum(h, sv)
    return sum(np.floor((w / s + 1 + _ROUNDING) * (h / s + 1 + _ROUNDING)) for s in map(float, strides))


def augmented_sides(w: np.ndarray, h: np.ndarray, args) -> tuple[np.ndarray, np.ndarray] | None:
    """The largest axis-aligned box (width, height) that Ultralytics' ``RandomPerspective._compute_affine_matrix`` and
    ``apply_bboxes`` (``ultralytics/data/augment.py`` lines 1132-1175, 1261) can make of a ``w`` x ``h`` box, or None
    where ``perspective`` is on (its projective divide has no bound on a box's growth): ``M = S @ R`` with ``R`` a rotation by up to
    ``degrees`` at a scale up to ``1 + scale`` (or ``scale[1]`` for a range) and ``S`` shears of up to ``shear``
    degrees; ``apply_bboxes`` takes the box of the four transformed corners, a width of ``|M00| w + |M01| h``.
    With ``c = |cos a|``, ``n = |sin a|``, ``t = tan(shear)``: ``|M00| <= s (c + t n)``, ``|M01| <= s (n + t c)`` (and
    the same with w and h exchanged for the height), so each side is at most ``s (P c + Q n)``, largest over
    ``a`` in ``[0, min(degrees, 90)]`` at ``atan2(Q, P)`` where that is inside, else at the end."""
    if args.perspective:
        return None
    scale = largest_scale(args.scale)
    t, most = math.tan(math.radians(min(abs(args.shear), 89))), math.radians(min(abs(args.degrees), 90))

    def side(p, q):
        turn = np.arctan2(q, p)
        return scale * np.where(turn <= most, np.hypot(p, q), p * math.cos(most) + q * math.sin(most))

    return side(w + t * h, t * w + h), side(t * w + h, w + t * h)


@dataclass(frozen=True, eq=False)  # arrays: compared, and hashed, by identity
class ObjectSizes:
    """The training set's objects, for the foreground bound: each object's image and its box's sides as fractions of
    the letterboxed image's long side (``BaseDataset.load_image`` resizes the long side to imgsz, ``ultralytics/data/
    base.py`` line 306), with the run's augmentation.

    Attributes:
        image: (n,) the index of each object's image; w, h: (n,) its sides (obb: its minimum-area rectangle's).
        rotated: obb (:func:`box_anchors`); images_per_sample: the images one augmented sample can hold
            (:func:`yolo_ckpt.memory.ultralytics_rules.augment_factors`' product: 4 for mosaic, ...).
        args: the augmentation keys read (scale, degrees, shear, perspective, multi_scale, mosaic).
        x, y: (n,) each box's centre, and extent: (images, 2) each image's sides (w, h), all fractions of its image's
            long side; None where the boxes lie is not known (a plan's assumed layout, a preprocessed batch).
    """

    image: np.ndarray
    w: np.ndarray
    h: np.ndarray
    rotated: bool
    images_per_sample: int
    args: tuple
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    extent: np.ndarray | None = None
    _most: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # per_image's, by (imgsz, strides, topk)

    @classmethod
    def of_batch(cls, batch: dict, task: str) -> ObjectSizes:
        """The sizes of a preprocessed training batch's objects as they are (square images, normalised ``bboxes``:
        xywh, or xywhr for obb), with no augmentation to come: what a step on that batch assigns. Without their places:
        with them the pair bound comes within 1% of the batch's own pairs, where the loss region's pair bytes
        (measured at 160 px) fall 0.02% short on yolo26n (the breaker's large layout, ``backbone,loss``)."""
        keys = tuple((k, 0.0) for k in AUGMENT_KEYS)
        boxes = batch["bboxes"].double().numpy()
        return cls(batch["batch_idx"].long().numpy(), boxes[:, 2], boxes[:, 3], task == "obb", 1, keys)

    @classmethod
    def assumed(cls, objects: int, side: float, task: str) -> ObjectSizes:
        """``objects`` boxes of ``side`` x ``side`` (a fraction of the image's side) in one image, with no augmentation
        to come: the layout a plan assumes without the data's labels (``side=1``: every box the whole image, the most
        candidate pairs any layout of that many objects can have)."""
        keys = tuple((k, 0.0) for k in AUGMENT_KEYS)
        return cls(np.zeros(objects, int), np.full(objects, float(side)), np.full(objects, float(side)), task == "obb", 1, keys)

    @property
    def key(self) -> str:
        """A digest of the sizes and keys (the estimate cache's key of a bound estimate)."""
        digest = hashlib.sha256(repr((self.rotated, self.images_per_sample, self.args)).encode())
        for a in (self.image, self.w, self.h, self.x, self.y, self.extent):
            digest.update(b"-" if a is None else np.ascontiguousarray(a).tobytes())
        return digest.hexdigest()[:16]

    @property
    def placed(self) -> bool:
        """Whether the bound also follows where the boxes lie (:func:`yolo_ckpt.memory.box_layout.most_per_sample`):
        their places are known and the augmentation keeps boxes axis-aligned (no rotation, shear or ``multi_scale``)."""
        keys = dict(self.args)
        return self.x is not None and not (self.rotated or keys["degrees"] or keys["shear"] or keys["multi_scale"])

    def per_image(self, imgsz: int, strides, topk: int) -> int:
        """The most foreground anchors one assigner of ``topk`` (its ``min(topk, topk2)``) can give one training image
        at ``imgsz`` (the size the step trains at): each object holds at most ``min(topk, box_anchors)`` of its box
        at its largest augmented size (``select_topk_candidates`` picks among the in-box anchors, and
        ``select_highest_overlaps`` leaves each anchor to one object), summed per image, times the images one
        sample holds. In pixels a side is its fraction x imgsz, plus (2 + ``multi_scale``) px: ``load_image`` rounds
        the resized side up (1 px) and ``multi_scale`` resizes the batch by up to (1 + ``multi_scale``), to the
        stride above. Where the boxes' places are known and the augmentation keeps boxes axis-aligned (no rotation,
        shear or ``multi_scale``), also at most :func:`yolo_ckpt.memory.box_layout.most_per_sample`: the objects of
        one image move on the anchor grid together, and a mosaic shows all of four images only at its smallest
        scales."""
        at = (imgsz, tuple(map(float, strides)), topk)
        if at not in self._most:  # a plan asks for the same sizes many times (its bisections)
            self._most[at] = self._per_image(imgsz, strides, topk)
        return self._most[at]

    def pairs_per_image(self, imgsz: int, strides, anchors: int) -> int:
        """The most candidate pairs (object, anchor in its box: ``select_candidates_in_gts``) one training image can
        hold at ``imgsz``: each object's :func:`box_anchors` at its largest augmented size, at most the ``anchors`` of
        the grid, summed over the densest image, times the images one sample holds (:meth:`per_image` with no
        ``topk``). The task-aligned assigner computes its overlaps pair by pair: its memory grows with these."""
        return self.per_image(imgsz, strides, anchors)

    def _per_image(self, imgsz: int, strides, topk: int) -> int:
        keys = dict(self.args)
        pad = 2 + keys["multi_scale"]
        w, h = self.w * imgsz + pad, self.h * imgsz + pad
        if self.rotated:  # rotation keeps a rectangle's sides (shear and perspective: no bound, object_sizes)
            w, h = w * largest_scale(keys["scale"]), h * largest_scale(keys["scale"])
        else:
            w, h = augmented_sides(w, h, SimpleNamespace(**keys))
        anchors = np.minimum(box_anchors(w, h, strides, self.rotated), topk)
        anywhere = int(self.images_per_sample * np.bincount(self.image, weights=anchors).max(initial=0))
        if not self.placed:
            return anywhere
        mosaic = keys.get("mosaic", 0) > 0
        others = self.images_per_sample // 4 if mosaic else self.images_per_sample  # mixup, copy-paste: whole samples
        return min(anywhere, others * most_per_sample(self, imgsz, strides, topk, scale_range(keys["scale"]), mosaic))


def object_sizes(labels: list[dict], args, task: str, images_per_sample: int) -> tuple[ObjectSizes | None, str]:
    """The :class:`ObjectSizes` of a training set's ``labels`` (``YOLODataset.labels``: normalised xywh ``bboxes``,
    ``segments``, the image's ``shape`` (h, w)) under the run's ``args``, and a sentence for the run's assumptions;
    None where the augmentation leaves no bound on a box's size (``perspective``; for obb, ``shear`` too: a sheared
    rectangle's minimum-area rectangle is not a scaled one)."""
    if args.perspective or (task == "obb" and args.shear):
        why = "perspective" if args.perspective else "shear"
        return None, f"{why}= leaves the labels' box sizes unbounded"
    image, sides, centres, extent = [], [], [], []
    for i, label in enumerate(labels):
        h0, w0 = label["shape"]
        aspect = np.array([w0, h0], dtype=np.float64) / max(h0, w0)  # the letterboxed image's sides / its long side
        extent.append(aspect)
        if task == "obb" and len(label["segments"]):
            from ultralytics.utils.ops import xyxyxyxy2xywhr

            corners = np.stack([np.asarray(s, np.float64).reshape(-1, 2) * aspect for s in label["segments"]])
            xywh = xyxyxyxy2xywhr(corners)[:, :4]  # the minimum-area rectangle the loss is given
        else:
            xywh = np.asarray(label["bboxes"], np.float64).reshape(-1, 4) * np.tile(aspect, 2)
        centres.append(xywh[:, :2])
        wh = xywh[:, 2:]
        image.append(np.full(len(wh), i))
        sides.append(wh)
    wh = np.concatenate(sides) if sides else np.zeros((0, 2))
    xy = np.concatenate(centres) if centres else np.zeros((0, 2))
    keys = (*((k, getattr(args, k)) for k in AUGMENT_KEYS), ("mosaic", mosaic(args)))
    sizes = ObjectSizes(
        np.concatenate(image) if image else np.zeros(0, int), wh[:, 0], wh[:, 1], task == "obb", images_per_sample, keys,
        xy[:, 0], xy[:, 1], np.array(extent).reshape(-1, 2),
    )
    return sizes, (
        f"box layout: each label's box at its largest (x {largest_scale(args.scale):g} for scale=, degrees={args.degrees}, "
        f"shear={args.shear}, multi_scale={args.multi_scale})"
        + (", where it lies: one image's boxes move on the anchor grid together" if sizes.placed else "")
        + (", a mosaic shows part of its images" if sizes.placed and mosaic(args) > 0 else "")
    )
