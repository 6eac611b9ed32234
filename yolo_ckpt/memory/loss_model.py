"""The loss's memory as a formula: bytes of its forward and backward peaks, linear in the task's terms.

Fake tensors cannot run the loss (its task-aligned assigner has data-dependent ops: ``nonzero``, ``topk`` over the
targets), so its memory is a formula per task, :class:`LossModel`, whose coefficients are fitted to CPU measurements
of the real loss at small sizes (:func:`yolo_ckpt.memory.loss_calibration.calibrate_loss`). The terms, in batch B,
anchors A (:func:`~yolo_ckpt.memory.ultralytics_rules.anchors`), objects per image M:

- detect, pose, obb (the assigner and the box losses): ``1, B*A, B*A*M, B*M``; with the loss region's chunked
  assigner (:mod:`yolo_ckpt.checkpointing.assigner`), whose dense (objects, anchors) rows are one image's chunk of
  ``assign_chunk`` objects at a time, ``A*min(M, assign_chunk)`` in place of ``B*A*M``. The forward adds the
  assigner's candidate pairs (object, anchor whose centre is in its box) beyond one per anchor, at
  :attr:`LossModel.pair_bytes` each (:meth:`LossModel.pairs`), and the loss region's piece of
  :data:`~yolo_ckpt.checkpointing.assigner.PAIR_PIECE` pairs whose overlaps it computes at once, at
  :attr:`LossModel.piece_bytes` per pair of it (for as many of those pairs as there are beyond one per anchor).
- segment: also the mask loss, whose per-image tensors grow with foreground anchors x mask pixels
  P = (imgsz / mask_ratio)^2: ``Fb*P, B*M*P, F1*P, B*P``, with Fb the batch's foreground anchors (over the loss's
  assigners: an end-to-end loss has two) and F1 the most that one assigner gives one image (the temporaries of one
  image's mask loss). Calibration counts the real foreground (the assigner's ``fg_mask``); the estimate takes its
  bound (:meth:`LossModel.foreground`), ``min(M * topk, A)`` per image and assigner, so it does not under-estimate
  where objects overlap or are small and claim fewer anchors; with the training set's box sizes (``data=``,
  :class:`~yolo_ckpt.memory.foreground.ObjectSizes`) also at most the anchors each object's box can hold at its
  largest augmented size, ``topk`` at most per object, summed per image (an object smaller than the anchor grid can
  only be given the few anchors inside it).
- YOLO26's ``SegTaskAlignedAssigner`` also decodes the predicted masks of each object's ``3 * topk`` best candidates
  (its mask IoU), in chunks of :data:`~yolo_ckpt.checkpointing.assigner.DECODE_CHUNK_PIXELS` mask pixels: one more
  term per such assigner, the most pixels decoded at once (:func:`_decoded`, for at most ``min(M * 3 * topk, A)``
  candidates per image), and one for the chunk it keeps decoded while it decodes the next (:func:`_previous`); with
  the loss region, where nothing of the first assigner's loss that grows with the foreground is alive while the
  second decodes (an end-to-end loss's two run one after the other) and each chunk is freed before the next, one
  term, the larger decoding.
- segment with the loss region (:mod:`yolo_ckpt.checkpointing.losses`: each image's mask loss run in chunks of
  ``chunk`` anchors in forward and recomputed in backward in tiles of fewer than ``2 * ANCHOR_TILE`` anchors, then by
  mask rows in tiles of about ``PIXEL_TILE`` anchor-pixels): no tensor holds a batch's or an image's whole foreground
  x P, so its mask terms are ``B*M*P, tile(F1, P), B*P, min(chunk, F1)*P``, with ``tile`` the most anchor-pixels of
  one backward tile (:func:`_tile_pixels`).
- classify: ``1, B``.
- semantic segmentation and depth, whose losses upsample the predictions to the input's resolution (Ultralytics'
  ``SemanticSegmentationLoss``, ``DepthLoss26``), in full-resolution pixels P = imgsz^2: depth ``1, B*P``; semantic
  ``1, B*P, [B > 1]*B*P``, the last the copy of the (B, nc, H, W) logits that the loss's channel-last ``reshape``
  makes past batch 1 (at batch 1 it is a view); the per-pixel coefficients hold the class count, fitted per ``nc``.

Two formulas per model: the loss's forward peak and its backward peak (above what was alive before the loss), since
the mask loss's backward peaks above its forward. Why the formula has each term, with the measurements that showed
it was needed: ``docs/benchmarks/memory-model.md``, "The loss formula's terms, measured".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checkpointing.assigner import DECODE_CHUNK_PIXELS, PAIR_PIECE
from ..checkpointing.losses import ANCHOR_TILE, PIXEL_TILE
from .ultralytics_rules import OBJECTLESS_TASKS, anchors


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
        pair_bytes: the forward's bytes per candidate pair beyond one per anchor
            (:data:`~yolo_ckpt.memory.loss_calibration.PAIR_POINTS`), added to the formula's forward peak for
            :meth:`pairs` beyond ``B*A``; 0 for a task without boxes.
        piece_bytes: the forward's bytes per pair of the loss region's piece of pairs whose overlaps are computed at
            once (the CIoU temporaries of :data:`~yolo_ckpt.checkpointing.assigner.PAIR_PIECE` pairs: index tensors
            and overlaps, not kept beyond the piece), for ``min(pairs beyond B*A, PAIR_PIECE)`` pairs; about 0 for the
            stock assigner, whose temporaries of every pair at once ``pair_bytes`` counts.
        kept: bytes the loss leaves alive once it returns, in every phase after its first call: the criterion's own
            tensors (Ultralytics builds it at the first step and keeps it: the DFL projection, ...) and what autograd
            keeps of its outputs until the backward (the loss items' storage); a few hundred bytes, constant.
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
    piece_bytes: float = 0.0
    kept: int = 0

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
        assigner's candidate pairs beyond one per anchor at :attr:`pair_bytes` each (:meth:`pairs`) and up to a piece
        of them at :attr:`piece_bytes` more."""
        beyond = max(0, self.pairs(batch, imgsz, objects, sizes) - batch * anchors(imgsz, self.strides)) if self.pair_bytes else 0
        pairs = self.pair_bytes * beyond + self.piece_bytes * min(beyond, PAIR_PIECE)
        return max(0, int(self.terms(batch, imgsz, objects, sizes=sizes) @ np.array(self.forward) + pairs))

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
