"""The loss region (``recompute=loss``): the task-aligned assigner in chunks of objects and the segmentation mask
loss recomputed in backward, both exact.

The assigner part is :mod:`yolo_ckpt.checkpointing.assigner` (every task with one: detect, obb, pose, segment); this module holds
the mask loss and hooks both on the model.

Ultralytics' ``v8SegmentationLoss.calculate_segmentation_loss`` (``ultralytics/utils/loss.py``; YOLO26's
``SegmentLoss26`` inherits it) builds, per image, a predicted mask ``einsum("in,nhw->ihw", coefficients, proto)``
and a float ground-truth mask, both (foreground anchors, H/4, W/4), then a per-pixel BCE cropped to each box; autograd
keeps the predicted and the ground-truth mask of every image until backward, so the loss's memory grows with
objects x topk x mask pixels (failure mode 30: with hundreds of objects per image it is most of the peak).

Here each image's mask loss is one ``torch.autograd.Function`` (:class:`_MaskLoss`):

- forward: the per-anchor losses of stock's ``single_mask_loss`` in chunks of ``loss_chunk`` anchors, under
  ``no_grad``; it keeps only its small inputs (the anchors' coefficients, the image's prototypes, the loss's mask
  tensor and indices into it, boxes, areas): the ground-truth mask is rebuilt from them where needed.
- backward: the einsum's two backward products are replayed on tiles, so that the whole mask gradient
  (anchors, H/4, W/4) never exists: the coefficients' gradient on tiles of anchor rows (all pixels), the
  prototypes' gradient on tiles of mask rows (all anchors), since each is a sum over the other dimension and
  splitting that sum would change its rounding. For each tile the predicted mask is recomputed with the einsum,
  under the forward's autocast state, keeping autograd's own graph of it; dL/d(predicted mask) is rebuilt chunk by
  chunk into that same buffer (BCE, crop, mean and area division replayed with autograd: elementwise, so identical
  to the whole tensor's), then the einsum's own backward runs on the tile. Tiles are sized to give the whole
  product's bits (:data:`ANCHOR_TILE`, :data:`PIXEL_TILE`), independently of ``loss_chunk``.

The per-anchor losses are concatenated and summed once per image, the image losses added in order and divided by
the foreground count, as stock does: the loss value, every gradient, and hence weights, BatchNorm buffers and EMA
equal stock training bit for bit on the CPU, for every chunk size (tested; the anchor tiles rely on the CPU BLAS
giving a row tile of >= ANCHOR_TILE rows the whole product's bits, measured for MKL here). The region ignores
``recompute_mode``: selective mode would keep the einsum's output, the very tensor the region exists to free.

How it is hooked: the model's class is swapped for a subclass (``LossRecomputedSegmentationModel``,
``LossRecomputedDetectionModel``, ...) whose ``init_criterion`` returns the stock criterion with the classes of its
segmentation losses swapped (``Recomputedv8SegmentationLoss``, ``RecomputedSegmentLoss26``; ``E2ELoss`` holds two)
and those of its assigners (:func:`yolo_ckpt.checkpointing.assigner.chunk_assigners`). Ultralytics builds the
criterion lazily in ``BaseModel.loss`` (first training loss, the EMA model's first validation) and in
``resume_training`` for end-to-end heads: all go through ``init_criterion``. The chunk size is a class attribute, and
every patched class pickles as its stock class (:class:`yolo_ckpt.checkpointing.patching.PickledAsStock`), so ``last.pt`` holds
only stock Ultralytics classes. The recomputed mask loss is active only when grad is enabled: validation, which runs
``model.loss`` under ``inference_mode``, runs the stock mask loss (the chunked assigner, same bits, in both).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from ultralytics.utils.loss import E2ELoss, v8SegmentationLoss
from ultralytics.utils.ops import crop_mask, xyxy2xywh

from . import patching
from .assigner import chunk_assigners
from .chunks import DEFAULT_ASSIGN_CHUNK, DEFAULT_CHUNK, check_assign_chunk, check_loss_chunk
from .policy import LOSS_HEADS, ModelLayout


def _anchor_losses(pred_mask, gt_mask, xyxy, area):
    """Per-anchor mask losses (n,) of predicted masks (n, h, w) against ``gt_mask`` (n, h, w); mirrors
    ``v8SegmentationLoss.single_mask_loss`` without its final sum."""
    loss = F.binary_cross_entropy_with_logits(pred_mask, gt_mask, reduction="none")
    return crop_mask(loss, xyxy).mean(dim=(1, 2)) / area


def _tile_losses(pred_mask, gt_mask, xyxy, area, rows: slice, pixels: int):
    """:func:`_anchor_losses` restricted to the mask rows ``rows`` (pred_mask and gt_mask (n, len(rows), w)), for
    backward only: its gradient w.r.t. ``pred_mask`` equals the rows' part of the whole one's, element for element
    (``mean``'s backward divides the expanded gradient by ``pixels``; ``sum / pixels``'s divides it before expanding:
    the same division of the same numbers)."""
    loss = F.binary_cross_entropy_with_logits(pred_mask, gt_mask, reduction="none")
    # Mirrors ultralytics.utils.ops.crop_mask for rows rows.start..rows.stop - 1 of the mask.
    x1, y1, x2, y2 = torch.chunk(xyxy[:, :, None], 4, 1)
    c = torch.arange(loss.shape[2], device=loss.device, dtype=x1.dtype)[None, None, :]
    r = torch.arange(rows.start, rows.stop, device=loss.device, dtype=x1.dtype)[None, :, None]
    loss *= (c >= x1) * (c < x2)
    loss *= (r >= y1) * (r < y2)
    return loss.sum(dim=(1, 2)) / pixels / area


def _gt_masks(masks, image, idx, overlap, rows: slice = slice(None)):
    """Ground-truth masks (n, len(rows), w) float of the anchors whose objects are ``idx``, as stock builds them:
    with ``overlap`` ``masks`` is (B, h, w) with ``k + 1`` marking image ``image``'s k-th object and ``idx`` is k;
    else ``masks`` is (objects, h, w) and ``idx`` a row of it."""
    if overlap:
        return (masks[image, rows] == (idx + 1).view(-1, 1, 1)).float()
    return masks[:, rows][idx]


def _split(size: int, parts: int) -> list[slice]:
    """``range(size)`` in ``parts`` (at least 1) contiguous slices whose lengths differ by at most one."""
    parts = max(1, min(parts, size))
    bounds = [size * k // parts for k in range(parts + 1)]
    return [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


# The tiling of the einsum's backward products, chosen so that the whole mask gradient (anchors, h, w) never exists
# and each tile gives the bits of the whole product (measured against MKL's sgemm, tests/test_losses.py):
# - the coefficients' gradient (anchors x pixels) @ (pixels x 32) by anchor rows: sgemm rounds some small row
#   counts differently (1-11 rows measured), so tiles hold at least ANCHOR_TILE rows, remainders spread over them;
# - the prototypes' gradient (32 x anchors) @ (anchors x pixels) by mask rows, at most PIXEL_TILE anchor-pixels a
#   tile and at least 2 rows (a 1-row tile would give einsum a size-1 dimension, which it contracts differently).
ANCHOR_TILE = 1024
PIXEL_TILE = 1 << 24


class _MaskLoss(torch.autograd.Function):
    """One image's per-anchor mask losses (n,), chunked in forward, recomputed in backward (see the module)."""

    @staticmethod
    def forward(ctx, pred, proto, masks, idx, xyxy, area, image: int, overlap: bool, chunk: int):
        """pred (n, 32) coefficients, proto (32, h, w), masks and idx as in :func:`_gt_masks`, xyxy (n, 4) boxes in
        mask pixels, area (n,) box areas as image fractions. Returns (n,) per-anchor losses."""
        ctx.save_for_backward(pred, proto, masks, idx, xyxy, area)
        ctx.image, ctx.overlap, ctx.chunk = image, overlap, chunk
        ctx.device = proto.device.type
        ctx.autocast = torch.is_autocast_enabled(ctx.device), torch.get_autocast_dtype(ctx.device)
        parts = []
        for s in range(0, len(pred), chunk):
            c = slice(s, s + chunk)
            pred_mask = torch.einsum("in,nhw->ihw", pred[c], proto)
            parts.append(_anchor_losses(pred_mask, _gt_masks(masks, image, idx[c], overlap), xyxy[c], area[c]))
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        pred, proto, masks, idx, xyxy, area = ctx.saved_tensors
        for counter in patching.ACTIVE_COUNTERS:
            counter.loss_images += 1
        (n, _), (_, h, w) = pred.shape, proto.shape
        d_pred = d_proto = None
        if ctx.needs_input_grad[0]:
            tiles = _split(n, n // ANCHOR_TILE)
            d_pred = torch.cat([_MaskLoss._tile_grad(ctx, grad, anchors, slice(0, h), 0) for anchors in tiles])
        if ctx.needs_input_grad[1]:
            tiles = _split(h, min(h // 2, n * h * w // PIXEL_TILE))
            d_proto = torch.cat([_MaskLoss._tile_grad(ctx, grad, slice(0, n), rows, 1) for rows in tiles], dim=1)
        return d_pred, d_proto, *(None,) * 7

    @staticmethod
    def _tile_grad(ctx, grad, anchors: slice, rows: slice, wrt: int):
        """The gradient of input ``wrt`` (0: coefficients, 1: prototypes) for the tile ``anchors`` x mask ``rows``:
        the tile's predicted mask is recomputed (under the forward's autocast state) with autograd's own einsum
        graph, its gradient rebuilt chunk by chunk into the same buffer, then the einsum's own backward replayed."""
        pred, proto, masks, idx, xyxy, area = ctx.saved_tensors
        enabled, dtype = ctx.autocast
        inputs = [pred[anchors].detach(), proto[:, rows].detach()]
        inputs[wrt].requires_grad_()
        with torch.enable_grad(), torch.autocast(ctx.device, dtype, enabled=enabled):
            pred_mask = torch.einsum("in,nhw->ihw", *inputs)
        # The einsum's backward needs its inputs only: the recomputed mask is overwritten by its gradient, each
        # chunk after its values were used.
        buffer = pred_mask.detach()
        for s in range(0, len(buffer), ctx.chunk):
            c = slice(s, s + ctx.chunk)
            a = slice(anchors.start + s, anchors.start + s + len(buffer[c]))
            leaf = buffer[c].detach().requires_grad_()
            with torch.enable_grad():
                with torch.autocast(ctx.device, dtype, enabled=enabled):
                    gt = _gt_masks(masks, ctx.image, idx[a], ctx.overlap, rows)
                    losses = _tile_losses(leaf, gt, xyxy[a], area[a], rows, proto.shape[1] * proto.shape[2])
                (g,) = torch.autograd.grad(losses, leaf, grad[a])
            buffer[c] = g
        (d,) = torch.autograd.grad(pred_mask, inputs[wrt], buffer)
        return d


class RecomputedMaskLoss(patching.PickledAsStock):
    """Mixin placed before ``v8SegmentationLoss`` or ``SegmentLoss26``: its mask loss is the loss region.

    Not instantiated: :func:`recompute_criterion` swaps a criterion's class. ``loss_chunk`` is set on each class.
    """

    loss_chunk = DEFAULT_CHUNK

    def calculate_segmentation_loss(
        self, fg_mask, masks, target_gt_idx, target_bboxes, batch_idx, proto, pred_masks, imgsz
    ):
        """Stock's ``calculate_segmentation_loss`` (same arguments and result), each image's mask loss a
        :class:`_MaskLoss`; the stock loss when grad is disabled (validation)."""
        if not torch.is_grad_enabled():
            return super().calculate_segmentation_loss(
                fg_mask, masks, target_gt_idx, target_bboxes, batch_idx, proto, pred_masks, imgsz
            )
        # Mirrors v8SegmentationLoss.calculate_segmentation_loss (ultralytics/utils/loss.py), operation for operation.
        _, _, mask_h, mask_w = proto.shape
        loss = 0
        target_bboxes_normalized = target_bboxes / imgsz[[1, 0, 1, 0]]
        marea = xyxy2xywh(target_bboxes_normalized)[..., 2:].prod(2)
        mxyxy = target_bboxes_normalized * torch.tensor([mask_w, mask_h, mask_w, mask_h], device=proto.device)
        for i, single_i in enumerate(zip(fg_mask, target_gt_idx, pred_masks, proto, mxyxy, marea)):
            fg_mask_i, target_gt_idx_i, pred_masks_i, proto_i, mxyxy_i, marea_i = single_i
            if fg_mask_i.any():
                idx = target_gt_idx_i[fg_mask_i]
                if not self.overlap:  # rows of masks: stock takes masks[batch_idx == i][idx]
                    idx = torch.nonzero(batch_idx.view(-1) == i).view(-1)[idx]
                anchor_losses = _MaskLoss.apply(
                    pred_masks_i[fg_mask_i], proto_i, masks, idx, mxyxy_i[fg_mask_i], marea_i[fg_mask_i],
                    i, self.overlap, self.loss_chunk,
                )
                loss += anchor_losses.sum()
            else:  # as stock: keeps every output in the graph for DDP
                loss += (proto * 0).sum() + (pred_masks * 0).sum()
        return loss / fg_mask.sum()


class LossRegionModel(patching.PickledAsStock):
    """Mixin placed before a model class with a loss region (``DetectionModel``, ``SegmentationModel``, ...): the
    criterion it builds chunks its assigners and recomputes its mask loss."""

    loss_chunk = DEFAULT_CHUNK
    assign_chunk = DEFAULT_ASSIGN_CHUNK

    def init_criterion(self):
        """The stock criterion, its assigners and segmentation losses patched (:func:`recompute_criterion`)."""
        return recompute_criterion(super().init_criterion(), self.loss_chunk, self.assign_chunk)


def _segmentation_losses(criterion) -> list:
    """The ``v8SegmentationLoss`` instances in a criterion: itself, or ``E2ELoss``'s one-to-many and one-to-one."""
    parts = [criterion.one2many, criterion.one2one] if isinstance(criterion, E2ELoss) else [criterion]
    return [p for p in parts if isinstance(p, v8SegmentationLoss)]


def recompute_criterion(criterion, chunk: int | None = DEFAULT_CHUNK, assign_chunk: int = DEFAULT_ASSIGN_CHUNK):
    """Patch ``criterion`` in place: its segmentation losses to recompute their mask loss in chunks of ``chunk``
    anchors and its assigners to run in chunks of ``assign_chunk`` objects, or both back to stock with
    ``chunk=None``; returns ``criterion``."""
    chunk_assigners(criterion, None if chunk is None else assign_chunk)
    for part in _segmentation_losses(criterion):
        stock = patching.stock_class(type(part))
        if chunk is None:
            part.__class__ = stock
        else:
            name = f"Recomputed{stock.__name__}"
            part.__class__ = patching.patched_class(RecomputedMaskLoss, stock, name, loss_chunk=chunk)
    return criterion


def _model(model):
    inner = patching.model_layers(model)
    if not ModelLayout.from_model(inner).has_loss_region:
        raise ValueError(
            f"recompute=loss: {type(inner).__name__} has no loss region; only detect, obb, pose and segment models "
            f"(heads {', '.join(LOSS_HEADS)}, whose losses have a task-aligned assigner) have one"
        )
    return inner


def apply_loss_region(model, chunk: int = DEFAULT_CHUNK, assign_chunk: int = DEFAULT_ASSIGN_CHUNK) -> None:
    """Apply the loss region to ``model``: its assigners in chunks of objects and, for a segmentation model, its mask
    loss recomputed in backward, exactly.

    Patches the model's class (and the criterion, if it is built already); inert when grad is disabled. Replaces a
    loss region applied before.

    Args:
        model: an Ultralytics model whose head is in :data:`yolo_ckpt.checkpointing.policy.LOSS_HEADS` (detect, obb, pose,
            segment; optionally wrapped in DDP or ``torch.compile``).
        chunk: anchors per chunk in the mask loss's forward (``loss_chunk=``); every chunk size gives the same bits,
            smaller ones less memory (chunk x H/4 x W/4 x 4 bytes per temporary).
        assign_chunk: objects per chunk of the assigner (``assign_chunk=``, :mod:`yolo_ckpt.checkpointing.assigner`); every
            chunk size gives the same bits, smaller ones less memory (assign_chunk x anchors x 4 bytes per
            temporary).

    Raises:
        ValueError: for a model without a loss region or a bad ``chunk`` or ``assign_chunk``; the model is then
            unchanged.
    """
    inner = _model(model)
    check_loss_chunk(chunk)
    check_assign_chunk(assign_chunk)
    stock = patching.stock_class(type(inner))
    name = f"LossRecomputed{stock.__name__}"
    inner.__class__ = patching.patched_class(
        LossRegionModel, stock, name, loss_chunk=chunk, assign_chunk=assign_chunk
    )
    if getattr(inner, "criterion", None) is not None:
        recompute_criterion(inner.criterion, chunk, assign_chunk)


def remove_loss_region(model) -> None:
    """Restore the stock loss of ``model`` (a no-op for a model without a loss region applied)."""
    inner = patching.model_layers(model)
    if isinstance(inner, LossRegionModel):
        inner.__class__ = patching.stock_class(type(inner))
    if getattr(inner, "criterion", None) is not None:
        recompute_criterion(inner.criterion, None)

