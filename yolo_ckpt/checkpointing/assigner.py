"""The task-aligned assigner in bounded memory, exactly (part of ``recompute=loss``).

Ultralytics' ``TaskAlignedAssigner._forward`` (``ultralytics/utils/tal.py``; ``RotatedTaskAlignedAssigner``,
``PoseTaskAlignedAssigner`` and ``SegTaskAlignedAssigner`` inherit it) builds several dense (batch, max objects,
anchors) tensors: the in-box mask, the overlaps and alignment metrics, the top-k counts, the positive mask and the
normalised metric. At 1024 px (21504 anchors) with 600 objects that is 52 MB per float tensor per image: with many
objects per image it is the step's peak under ``recompute=all``. Here the same assignment runs over chunks of
``assign_chunk`` objects of one image, so that its transient is O(assign_chunk x anchors + candidate pairs), where a
candidate pair is an (object, anchor) with the anchor inside the object's box (a few per small object, up to the
anchors' count per object for boxes that cover the image):

1. candidates: per chunk, stock's ``select_candidates_in_gts`` on the chunk's boxes; each chunk keeps the flat
   positions of its pairs (int32), in stock's order (row-major over image, object, anchor);
2. pair metrics: each pair's class score and overlap (stock's ``pair_overlaps``) computed ``PAIR_PIECE`` pairs at a
   time (its operations give an element the same bits at any place in the list: tested on every variant), then the
   alignment metric's powers over the whole list, as stock computes them (a CPU ``pow`` gives an element's
   bits by its place in the vector loop: ``pow(6.0)`` is 1 ulp apart between a list and its slices). What stays is
   12 bytes a pair (position, score turned metric, overlap) and one piece's temporaries; stock's assigner holds ~120
   bytes a pair at once (the index triples, the gathered boxes and CIoU's temporaries);
3. first pass, per chunk: the dense rows (chunk x anchors) of the overlaps and metrics are scattered from the pair
   list, each object's row top-k'd at full length with stock's ``select_topk_candidates`` (early in training many
   in-box metrics are exactly 0, and ``torch.topk``'s choice among tied zeros decides the positives); per anchor it
   carries the claim count and a running argmax of the overlaps over all objects (strict ``>``, so ties keep the
   first index as ``max(1)`` does; a NaN wins over a number and the first NaN is kept, as ``max`` propagates NaN),
   and the positives of each row are kept sparsely (at most ``topk`` per object);
4. second pass, per chunk: ``select_highest_overlaps``' rule (an anchor claimed more than once goes to the running
   argmax), its ``topk2`` filter, the final positive mask, the per-anchor first-positive object (``max(-2)``) and the
   normalisation (per-object ``amax``, per-anchor running ``torch.maximum``, which propagates NaN as ``amax`` does),
   the rows rebuilt from the pair list;
5. stock's ``get_targets`` over the whole batch (its outputs are per anchor).

Every output (labels, boxes, scores, foreground mask, object index) equals stock's bit for bit on the CPU, for every
chunk size (tested, ``tests/checkpointing/test_assigner.py``): each value is computed by the same operation on the same operands
(per-row top-k, exact maxima and sums of 0/1 counts). On CUDA, ``torch.topk`` may change algorithm with the number
of rows: exactness there is untested.

Extra tensors of the task variants are passed whole to ``pair_overlaps`` with the pair list, so none is sliced:
pose's ``gt_kpts`` (b, max objects, K, 3) is per object, ``pd_kpts`` (b, anchors, K, 2) per anchor, ``anc_strides``
(anchors,) per anchor for every image; segmentation's ``gt_masks`` (b, objects, mh, mw) is per object, ``pd_coef``
(b, anchors, nm) per anchor, ``proto`` (b, nm, mh, mw) and ``mask_scale`` (b, 1) per image. YOLO26's
segmentation assigner (:class:`ChunkedSegAssignment`) replaces its dense (b, max objects, anchors) box metric by
per-chunk rows, decodes the union of its candidate anchors once per image in stock's order and shapes (a matrix
product of a few rows may round differently from the whole one), and chunks by object only the mask
intersections (integer counts, exact in any grouping) and their IoU buffer; the decoded masks of one chunk of images
stay its peak. Stock keeps a chunk's decoded masks (the bool masks and their float copy) until the next chunk's
replace them, so at two chunks or more it holds 9-10 bytes a mask pixel at once; this one frees them first, 5 bytes a
pixel (yolo26n-seg at 480 px, batch 4, 200 objects: the loss's forward peak 1062 -> 600 MiB).

How it is hooked: :func:`chunk_assigners` swaps the class of a criterion's assigner(s) for a subclass
(``ChunkedTaskAlignedAssigner``, ...) that pickles as its stock class (:class:`yolo_ckpt.checkpointing.patching.PickledAsStock`);
:mod:`yolo_ckpt.checkpointing.losses` calls it when it builds the criterion of a model with the loss region.
"""

from __future__ import annotations

import torch
from ultralytics.utils.ops import crop_mask
from ultralytics.utils.tal import SegTaskAlignedAssigner, TaskAlignedAssigner
from ultralytics.utils.torch_utils import autocast

from . import patching
from .chunks import DEFAULT_ASSIGN_CHUNK, check_assign_chunk

PAIR_PIECE = 1 << 13  # candidate pairs whose overlaps are computed at once: ~100 B each in stock's CIoU, under 1 MB
# Mask pixels YOLO26's SegTaskAlignedAssigner.pair_overlaps decodes per chunk of images (it computes the chunk inline,
# ultralytics/utils/tal.py line 482: ``(1 << 27) // (m * mh * mw)`` images a chunk, at least one), mirrored here; the
# memory model reads it from here (yolo_ckpt.memory.ultralytics_rules), as the mechanism may not import the memory wing
DECODE_CHUNK_PIXELS = 1 << 27


def _candidates(assigner, anc_points, gt_bboxes, mask_gt, chunk: int) -> list[tuple[int, slice, torch.Tensor]]:
    """The candidate pairs, chunk by chunk: (image, object slice, flat positions ``object_in_chunk * anchors +
    anchor`` of its in-box pairs, row-major as stock's ``nonzero`` lists them; int32 where they fit)."""
    na, (bs, n) = anc_points.shape[0], mask_gt.shape[:2]
    found = []
    for b in range(bs):
        for g in range(0, n, chunk):
            objects = slice(g, min(g + chunk, n))
            in_box = assigner.select_candidates_in_gts(anc_points, gt_bboxes[b : b + 1, objects], mask_gt[b : b + 1, objects])
            where = (in_box & mask_gt[b : b + 1, objects].bool()).view(-1).nonzero().squeeze(1)
            found.append((b, objects, where.int() if (objects.stop - objects.start) * na < 2**31 else where))
    return found


def _pieces(chunks, na: int):
    """The (image, object, anchor) index tensors of the candidate pairs, at most ``PAIR_PIECE`` at a time, in
    stock's order; at least one (maybe empty) piece per chunk."""
    for b, objects, where in chunks:
        for s in range(0, max(len(where), 1), PAIR_PIECE):
            w = where[s : s + PAIR_PIECE].long()
            yield torch.full_like(w, b), w // na + objects.start, w % na


def _rows(values, where, rows: int, na: int):
    """Dense rows (rows, na) holding ``values`` (pairs,) at the flat positions ``where``, 0 elsewhere: a chunk's rows of
    stock's ``overlaps[indices] = values`` into zeros."""
    dense = torch.zeros(rows * na, dtype=values.dtype, device=values.device)
    dense[where.long()] = values
    return dense.view(rows, na)


def _first_max(best, best_idx, rows, start: int):
    """Merge ``rows.max(0)`` (object indices offset by ``start``) into the running (``best``, ``best_idx``) per
    anchor as one ``max`` over all rows would: strict ``>``, a NaN beats a number, the first NaN stays.
    ``best=None`` starts it. Returns the new pair."""
    value, idx = rows.max(0)
    idx += start
    if best is None:
        return value, idx
    take = value > best
    if value.is_floating_point():
        take |= value.isnan() & ~best.isnan()
    return torch.where(take, value, best), torch.where(take, idx, best_idx)


class ChunkedAssignment(patching.PickledAsStock):
    """Mixin placed before a ``TaskAlignedAssigner`` class: its ``_forward`` runs over chunks of objects (see the
    module). Not instantiated: :func:`chunk_assigners` swaps an assigner's class; ``assign_chunk`` is set on it."""

    assign_chunk = DEFAULT_ASSIGN_CHUNK

    def _forward(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt, **extra):
        """Stock's ``TaskAlignedAssigner._forward`` (same arguments and results, bit for bit on the CPU), in chunks
        of ``assign_chunk`` objects of one image."""
        for counter in patching.ACTIVE_COUNTERS:
            counter.assignments += 1
        bs, na = self.bs, anc_points.shape[0]
        gt_valid = mask_gt.bool()
        # 1. candidate pairs, per chunk (stock's `indices` in get_box_metrics, (mask_in_gts * mask_gt).nonzero())
        chunks = _candidates(self, anc_points, gt_bboxes, mask_gt, self.assign_chunk)
        offsets = [0, *torch.tensor([len(w) for *_, w in chunks]).cumsum(0).tolist()]
        # 2. the pairs' metrics
        align_values, overlap_values = self._pair_metrics(chunks, na, pd_scores, pd_bboxes, gt_labels, gt_bboxes, **extra)

        def rows(values, i):
            _, objects, where = chunks[i]
            return _rows(values[offsets[i] : offsets[i + 1]], where, objects.stop - objects.start, na)

        # 3. first pass: positives of each row (get_pos_mask), claims and the argmax of overlaps per anchor
        claims = torch.zeros(bs, na, dtype=torch.int64, device=pd_scores.device)
        best = [None] * bs
        positives = []
        for i, (b, objects, where) in enumerate(chunks):
            valid = gt_valid[b : b + 1, objects]
            mask_topk = self.select_topk_candidates(rows(align_values, i)[None], topk_mask=valid.expand(-1, -1, self.topk))[0]
            in_box = _rows(torch.ones_like(where, dtype=torch.bool), where, objects.stop - objects.start, na)
            mask_pos = mask_topk.mul_(in_box).mul_(valid[0])
            claims[b] += mask_pos.sum(0)
            best[b] = _first_max(*(best[b] or (None, None)), rows(overlap_values, i), objects.start)
            positives.append(mask_pos.nonzero())
        # 4. second pass: select_highest_overlaps, then the normalisation of _forward
        fg = [None] * bs
        norm = [None] * bs
        for i, ((b, objects, _), pos) in enumerate(zip(chunks, positives)):
            mask_pos = torch.zeros(objects.stop - objects.start, na, dtype=torch.int8, device=pd_scores.device)
            mask_pos[pos[:, 0], pos[:, 1]] = 1
            winner = best[b][1] == torch.arange(objects.start, objects.stop, device=mask_pos.device)[:, None]
            mask_pos = torch.where(claims[b] > 1, winner.to(mask_pos.dtype), mask_pos)
            align_metric = rows(align_values, i)
            if self.topk2 != self.topk:
                top = torch.topk(align_metric * mask_pos, self.topk2, dim=-1, largest=True).indices
                mask_pos *= torch.zeros_like(mask_pos).scatter_(-1, top, 1.0)
            fg[b] = _first_max(*(fg[b] or (None, None)), mask_pos, objects.start)
            align_metric *= mask_pos
            pos_align_metrics = align_metric.amax(dim=-1, keepdim=True)
            overlaps = rows(overlap_values, i) * mask_pos
            pos_overlaps = overlaps.amax(dim=-1, keepdim=True)
            align_metric.mul_(pos_overlaps).div_(pos_align_metrics + self.eps)
            norm[b] = align_metric.amax(0) if norm[b] is None else torch.maximum(norm[b], align_metric.amax(0))
        fg_mask = torch.stack([f[0] for f in fg])
        target_gt_idx = torch.stack([f[1] for f in fg])
        # 5. targets, as stock
        target_labels, target_bboxes, target_scores = self.get_targets(gt_labels, gt_bboxes, target_gt_idx, fg_mask)
        target_scores = target_scores * torch.stack(norm).unsqueeze(-1)
        return target_labels, target_bboxes, target_scores, fg_mask.bool(), target_gt_idx

    def _pair_metrics(self, chunks, na: int, pd_scores, pd_bboxes, gt_labels, gt_bboxes, **extra):
        """The alignment metric and overlap (P,) of the candidate pairs of ``chunks``: stock's ``get_box_metrics``
        (``ultralytics/utils/tal.py``) without its dense (b, max objects, anchors) outputs. The pairs' scores and
        overlaps are computed ``PAIR_PIECE`` pairs at a time; the metric's powers over the whole list, as stock computes
        them (a CPU ``pow`` gives an element's bits by its place in the vector loop)."""
        scores = torch.cat([pd_scores[b, a, gt_labels[b, g, 0].long()] for b, g, a in _pieces(chunks, na)])
        overlaps = self._pair_overlaps(chunks, na, scores, gt_bboxes, pd_bboxes, **extra)
        scores = scores.pow(self.alpha)  # not in place: under autocast stock's pow and product may change the dtype
        return scores * overlaps.pow(self.beta), overlaps

    def _pair_overlaps(self, chunks, na: int, scores, gt_bboxes, pd_bboxes, **extra):
        """Stock's ``pair_overlaps`` (P,) of the candidate pairs of ``chunks``, ``PAIR_PIECE`` pairs at a time (its
        operations give an element the same bits at any place in the list; tested). ``scores`` (P,): the pairs'
        class scores, for the variants that need them."""
        return torch.cat([self.pair_overlaps(i, gt_bboxes, pd_bboxes, **extra) for i in _pieces(chunks, na)])


class ChunkedSegAssignment(ChunkedAssignment):
    """Mixin placed before ``SegTaskAlignedAssigner``: its dense box metric and mask-IoU buffer run over chunks of
    objects too (see the module)."""

    def _pair_overlaps(self, chunks, na: int, scores, gt_bboxes, pd_bboxes, pd_coef, mask_scale, proto, gt_masks):
        """Stock's ``SegTaskAlignedAssigner.pair_overlaps`` (same result), its box IoUs computed ``PAIR_PIECE`` pairs at
        a time, its dense box metric built and top-k'd per chunk of objects and its intersections and IoU buffer per
        chunk of objects."""
        # Mirrors SegTaskAlignedAssigner.pair_overlaps (ultralytics/utils/tal.py), line for line but where noted.
        iou = torch.cat([TaskAlignedAssigner.pair_overlaps(self, i, gt_bboxes, pd_bboxes) for i in _pieces(chunks, na)])
        n = self.n_max_boxes
        metric = scores.pow(self.alpha) * iou.pow(self.beta) + self.eps
        k = min(3 * self.topk, na)
        sel, b, g, a, start = [], [], [], [], 0  # stock: the pairs among each gt's k best of its dense row, in pair order
        for chunk_b, objects, where in chunks:
            dense = _rows(metric[start : start + len(where)], where, objects.stop - objects.start, na)
            top = torch.zeros_like(dense, dtype=torch.bool).scatter_(-1, dense.topk(k, dim=-1).indices, True)
            local = top.view(-1)[where.long()].nonzero().squeeze(1)
            w = where[local].long()
            sel.append(local + start)
            b.append(torch.full_like(w, chunk_b))
            g.append(w // na + objects.start)
            a.append(w % na)
            start += len(where)
        del metric
        sel, b, g, a = (torch.cat(x) for x in (sel, b, g, a))
        if len(sel):  # decode each selected anchor's mask once, packed into per-image slots
            (mh, mw) = proto.shape[-2:]
            key, inv = (b * na + a).unique(return_inverse=True)
            ub, ua = key // na, key % na
            count = torch.bincount(ub, minlength=self.bs)
            slot = torch.arange(len(key), device=key.device) - (count.cumsum(0) - count)[ub]
            order = count.argsort(descending=True)  # images by anchor count, so each chunk pads only to its own largest
            r, counts = order.argsort()[ub], count[order].tolist()
            coef = pd_coef.new_zeros(self.bs, counts[0], pd_coef.shape[-1])
            boxes = pd_bboxes.new_zeros(self.bs, counts[0], 4)
            coef[r, slot], boxes[r, slot] = pd_coef[ub, ua], pd_bboxes[ub, ua] * mask_scale[ub]
            dtype = torch.half if proto.device.type == "cuda" else torch.float
            sel_r, sel_slot = r[inv], slot[inv]
            miou = torch.zeros_like(iou[sel])
            i = 0
            while i < self.bs and counts[i]:
                m = counts[i]
                s = slice(i, i + max(1, DECODE_CHUNK_PIXELS // (m * mh * mw)))  # ~128M mask pixels per chunk
                o = order[s]
                pm = (coef[s, :m] @ proto[o].flatten(2)) > 0
                pm = crop_mask(pm.view(-1, mh, mw), boxes[s, :m].reshape(-1, 4)).view(pm.shape)
                pmt, pm_area = pm.to(dtype).transpose(1, 2), pm.sum(-1)
                del pm
                # Not stock: the intersections (integer counts, exact in any grouping) and the IoU buffer per chunk
                # of objects, and only the selected pairs' IoUs kept.
                for objects in (slice(j, min(j + self.assign_chunk, n)) for j in range(0, n, self.assign_chunk)):
                    gm = gt_masks[o, objects].flatten(2).to(dtype)
                    with autocast(False):  # intersections over <=2048-pixel blocks are exact FP16 integers
                        inter = sum(
                            (gm[..., k : k + 2048] @ pmt[:, k : k + 2048]).float() for k in range(0, mh * mw, 2048)
                        )
                    union = gm.sum(-1, dtype=torch.float)[..., None] + pm_area[:, None] - inter
                    ious = inter / union.clamp(min=1)
                    here = (sel_r >= s.start) & (sel_r < s.start + len(o)) & (g >= objects.start) & (g < objects.stop)
                    miou[here] = ious[sel_r[here] - s.start, g[here] - objects.start, sel_slot[here]]
                # Not stock: this chunk's decoded masks go before the next chunk's decode (stock keeps them until its
                # next `pmt =`, over the next product and mask: 9 bytes a mask pixel, not 5)
                del pmt, pm_area
                i = s.start + len(o)
            iou[sel] += miou  # stock: (iou + miou) / 2 with miou 0 but at the selected pairs; x + 0 is x exactly
        return iou.div_(2)


def _chunked_class(stock: type, chunk: int) -> type:
    mixin = ChunkedSegAssignment if issubclass(stock, SegTaskAlignedAssigner) else ChunkedAssignment
    return patching.patched_class(mixin, stock, f"Chunked{stock.__name__}", assign_chunk=chunk)


def assigners(criterion) -> list[TaskAlignedAssigner]:
    """The task-aligned assigners of a criterion: its own, or those of an end-to-end criterion's one-to-many and
    one-to-one losses (``E2ELoss``, ``E2EDetectLoss``); empty for a criterion without one."""
    parts = [getattr(criterion, p) for p in ("one2many", "one2one") if hasattr(criterion, p)] or [criterion]
    return [p.assigner for p in parts if isinstance(getattr(p, "assigner", None), TaskAlignedAssigner)]


def chunk_assigners(criterion, chunk: int | None = DEFAULT_ASSIGN_CHUNK):
    """Swap the class of each of ``criterion``'s task-aligned assigners (:func:`assigners`) in place for its chunked
    subclass with ``chunk`` objects per chunk, or back to stock with ``chunk=None``; returns ``criterion``.

    Raises:
        ValueError: for a bad ``chunk`` (:func:`~yolo_ckpt.checkpointing.chunks.check_assign_chunk`).
    """
    if chunk is not None:
        check_assign_chunk(chunk)
    for assigner in assigners(criterion):
        stock = patching.stock_class(type(assigner))
        assigner.__class__ = stock if chunk is None else _chunked_class(stock, chunk)
    return criterion
