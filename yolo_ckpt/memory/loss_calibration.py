"""Calibrate the loss formula (:class:`~yolo_ckpt.memory.loss_model.LossModel`): measure the real loss on the CPU at
small sizes and fit the formula's coefficients to the measurements.

:func:`calibrate_loss` measures ``model.loss`` as it is (with the loss region where one is applied) at
:data:`CALIBRATION_POINTS`, on random predictions of the model's shapes and dtypes (the loss's memory depends on
shapes and targets, not values: the predictions' shapes come from one fake pass, :func:`_prediction_specs`) and the
task's synthetic batch (:func:`~yolo_ckpt.memory.synthetic_batch.training_batch`), counting live tensors
(:class:`~yolo_ckpt.memory.tracker.LiveTensorTracker`) and the foreground anchors the assigner gives. The fits:
least squares, but for segmentation, whose estimate must not fall under the measurement, an upper bound of its
calibration measurements (a linear program, ``scipy.optimize.linprog``: non-negative coefficients, no measurement
under-estimated, the least total relative over-estimate), since its peak is a maximum over moments of the loss (two
assigners' decoding, each image's mask loss) that a sum of terms only approximates. The loss region's segmentation
fit also measures whole backward tiles (:data:`TILE_POINTS`); the stock loss's mask-pixel coefficients carry
:data:`MASK_TERMS_MARGIN` instead, since a bound of the calibration's small sizes is not one of sizes far above them.
The bytes of a candidate pair beyond one per anchor, and of the loss region's piece of pairs, are measured
(:data:`PAIR_POINTS`), not fitted, and the decoding
term's bytes per pixel have a floor (:data:`DECODED_BYTES_PER_PIXEL`). :func:`loss_models` calibrates a model's stock
loss and, where its head has one, its loss region.

A calibration is kept per model YAML, class count, mask settings, loss region and AMP, in this process and on disk
(:mod:`yolo_ckpt.memory.estimate_cache`). Under AMP (Ultralytics runs it on CUDA only) the loss runs under CUDA fp16
autocast's dtypes, emulated on the CPU (:func:`yolo_ckpt.memory.amp.cuda_amp_emulated`). The measurements behind the
points, the margin and the floor: ``docs/benchmarks/memory-model.md``, "The loss formula's terms, measured".
"""

from __future__ import annotations

import copy
import dataclasses
import inspect

import numpy as np
import torch
from torch.utils._pytree import tree_map
from ultralytics.utils.tal import SegTaskAlignedAssigner

from ..checkpointing.assigner import PAIR_PIECE
from ..checkpointing.chunks import DEFAULT_ASSIGN_CHUNK, DEFAULT_CHUNK, check_assign_chunk, check_loss_chunk
from ..checkpointing.losses import apply_loss_region, remove_loss_region
from ..checkpointing.policy import ModelLayout
from . import estimate_cache
from .amp import cuda_amp_emulated
from .fake_copy import fake_copy
from .foreground import candidate_pairs
from .loss_model import LossModel
from .synthetic_batch import training_batch
from .threads import one_thread
from .tracker import LiveTensorTracker, tensor_bytes
from .ultralytics_rules import OBJECTLESS_TASKS, input_channels, mask_ratio, model_task

# (batch, imgsz, objects per image) at which the real loss is measured to fit its formula: small (imgsz <= 160), so
# fast, and spread in every term (1 to 3 images, 1 to 240 objects: below and above the anchors' count) so that the
# fit does not confuse one term with another and extrapolates to sizes far above these. DENSE_POINTS: hundreds to
# thousands of objects over thousands of anchors, where the stock assigner's (batch, objects, anchors) tensors hold
# the loss's peak; at 160 px or less, so that the steps the tests check at twice the largest size still extrapolate.
DENSE_POINTS = ((1, 160, 600), (1, 160, 1500), (2, 128, 900))
CALIBRATION_POINTS = tuple(
    (b, s, m)
    for i, (b, s) in enumerate((b, s) for b in (1, 2, 3) for s in (64, 96, 128, 160))
    for m in ((1, 2, 4, 6, 9, 14)[i % 6], (20, 30, 45, 70, 110, 160, 240)[i % 7])
) + DENSE_POINTS

# The candidate pairs (object, anchor whose centre is in its box), over which the task-aligned assigner computes its
# overlaps pair by pair (stock holds ~120 bytes a pair at once; the loss region ~13 a pair kept, and the CIoU
# temporaries of a piece of PAIR_PIECE pairs at once, yolo_ckpt.checkpointing.assigner), grow with the boxes' areas:
# the grid-laid points above hold about one per anchor, so the fitted terms carry that many, and large boxes that
# overlap carry objects x anchors. The same objects grid-laid (fewer pairs than a piece), at boxes of 60% of the side
# and of the whole image (both more than a piece) differ in their pairs only: the assigner's own peak's difference over
# the pairs' difference between the last two is the bytes of each pair beyond one per anchor (LossModel.pair_bytes;
# the assigner's, not the loss's: a segmentation loss's peak can be its mask loss), and what the first two differ by
# beyond that, over the piece's pairs it adds, the bytes of each pair of the piece (LossModel.piece_bytes: without it
# the formula fell 18% under yolo26n's loss region at 160 px with 100 whole-image boxes, pairs counted exactly).
PAIR_POINTS = ((1, 160, 100), (1, 160, 100, (0.6, 0.6)), (1, 160, 100, (1.0, 1.0)))

# A segmentation fit is an upper bound of its calibration measurements, not of sizes beyond them: there its terms that
# do not grow with the mask pixels (1, B*A, ...) hold slack that the fit trades for lower mask-pixel coefficients, so
# it falls short where the mask terms dominate; the stock loss's mask-pixel coefficients carry this margin.
MASK_TERMS_MARGIN = 0.05

# The loss region's backward holds one tile of an image's foreground anchors x mask pixels (tile(F1,P), at most
# 2 * ANCHOR_TILE - 1 anchors, or every anchor by a few mask rows) and, while it rebuilds the tile's gradient, one
# chunk's temporaries (min(chunk,F1)*P): its peak is the larger of the two moments, about 4 B per tile anchor-pixel
# plus 20 per chunk anchor-pixel while the chunks run, 8 plus 8 in the einsum's own backward (fp32, measured on
# _MaskLoss alone). CALIBRATION_POINTS' foregrounds (at most the 525 anchors of 160 px) are each one chunk and one
# tile, where the two terms cannot be told apart: the fit summed them. These steps (grid-laid objects: about 600, 1950
# and 2400 foreground anchors) make the fit the chord of that maximum, with its ends measured: MoNuSeg's step of two
# whole tiles at 1024 px 1.08x over (was 1.13x), the loss's backward at one whole tile at 512 px 9.6% over (was 17%).
# The mask terms grow no further than a tile, and per mask pixel a tile's bytes fall as the mask grows (9.1 at 80 x 80,
# 9.0 at 256 x 256), so the region's fit needs no margin.
TILE_POINTS = ((1, 320, 60), (1, 384, 200), (1, 384, 240))

# Bytes per mask pixel that YOLO26's SegTaskAlignedAssigner.pair_overlaps (ultralytics/utils/tal.py) holds while it
# decodes, on the CPU where the calibration measures it: each pixel's bool mask (`> 0`, 1 B) with the float32 product
# it comes from, and later with its float32 copy (`pm.to(dtype)`, float off CUDA): 4 + 1. The least coefficient of
# the formula's last term: the loss region's decoding, and the stock loss's previous chunk (loss_model._previous, 0 at
# every calibration point: its chunks of 2^27 pixels hold every calibration batch). The calibration's points
# (<= 160 px) decode too few pixels to tell the decoding from the other terms. The stock loss's own two decoding terms
# stay fitted: at this floor they would count its two assigners' decodings at once.
DECODED_BYTES_PER_PIXEL = 5.0


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
        mask_ratio(model),
        tuple(min(a.topk, a.topk2) for a in _assigners(model.criterion)),
        (),
        (),
        getattr(model, "loss_chunk", None),
        tuple(3 * a.topk for a in _assigners(model.criterion) if isinstance(a, SegTaskAlignedAssigner)),
        getattr(model, "assign_chunk", None),
    )
    tiles = TILE_POINTS if shape.task == "segment" and shape.chunk else ()
    points = CALIBRATION_POINTS + tiles
    if shape.task in OBJECTLESS_TASKS:  # objects do not change their batch: each (batch, imgsz) once
        points = tuple(sorted({(b, s, 0) for b, s, _ in points}))
    pair_points = () if shape.task in OBJECTLESS_TASKS else PAIR_POINTS  # measured with the others: one prediction pass
    rows, forward, backward, pairs, assigned, kept = _loss_samples(model, shape, points + pair_points, amp)
    with LiveTensorTracker() as tracker:
        criterion = model.init_criterion()  # noqa: F841  (held while its tensors are counted)
        own = tracker.live_bytes  # the criterion's tensors: a run builds its criterion once and keeps it
    n = len(points)
    rows, forward, backward = rows[:n], forward[:n], backward[:n]
    (grid, few, many), pairs = assigned[n:] or (0, 0, 0), pairs[n:] or (0, 0, 0)
    fit = lambda y, lower=None: _fit(rows, np.array(y, float), upper=shape.task == "segment", lower=lower)  # noqa: E731
    # the decoding's bytes per mask pixel are the code's, not the fit's: its points decode too few pixels to tell them
    decoding = [0.0] * (rows.shape[1] - 1) + [DECODED_BYTES_PER_PIXEL] if shape.mask_topk else None  # the last term
    forward, backward = fit(forward, decoding), fit(backward)
    if shape.task == "segment" and not tiles:  # the stock loss's mask-pixel terms (from the 5th on): the margin
        forward, backward = (c[:4] + tuple(v * (1 + MASK_TERMS_MARGIN) for v in c[4:]) for c in (forward, backward))
    pair_bytes = max(0.0, (many - few) / max(pairs[2] - pairs[1], 1))  # the bytes of a pair beyond the fitted ones
    piece = min(pairs[1], PAIR_PIECE) - min(pairs[0], PAIR_PIECE)  # the piece's pairs the 60% boxes add
    piece_bytes = max(0.0, (few - grid - pair_bytes * (pairs[1] - pairs[0])) / max(piece, 1))
    pair = {"pair_bytes": pair_bytes, "piece_bytes": piece_bytes}
    return dataclasses.replace(shape, forward=forward, backward=backward, **pair, kept=own + max(kept))


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


def _loss_samples(model, shape: LossModel, points, amp: bool) -> tuple[np.ndarray, list[int], list[int], list[int], list[int], list[int]]:
    """CPU measurements of ``model``'s real loss at ``points`` (batch, imgsz, objects, and optionally the boxes' sides
    (lo, hi) as fractions of the image, else grid-laid: :func:`~yolo_ckpt.memory.synthetic_batch.training_batch`): the formula's
    terms (with the measured foreground anchors), the loss's forward and backward peaks above what was alive before it,
    the candidate pairs of its assigner, the assigner's own peak above what was alive when it started (the most of
    its assigners'), and the bytes of what the loss returns (its total and items)."""
    g = torch.Generator().manual_seed(0)
    stride = int(max(model.stride.tolist()))
    points = [(batch, max(imgsz // stride, 1) * stride, objects, *sides) for batch, imgsz, objects, *sides in points]
    specs = _prediction_specs(model, sorted({imgsz for _, imgsz, *_ in points}), amp)
    rows, forward, backward, pairs, assigned, kept = [], [], [], [], [], []
    with one_thread():  # small tensors: yolo_ckpt.memory.threads
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
                        out = model.loss(data, preds)
                        loss = out[0].sum()
                    forward.append(tracker.phase_peak_bytes - before)
                    kept.append(tensor_bytes(out))  # the loss items' storage: autograd holds it into the backward
                    del out
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
    return np.array(rows), forward, backward, pairs, assigned, kept


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
    Kept per model, sizes and amp in this process: the loss region's calibration (:func:`loss_models` calibrates a
    copy with and one without it) changes the loss, not the predictions, and need not pass again."""
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
                specs = {first: spec(fake(torch.empty(1, input_channels(model), first, first)))}
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


def loss_models(
    model, amp: bool, chunk: int | None = None, assign_chunk: int | None = None
) -> dict[bool, LossModel]:
    """The loss formula without (``False``) and, where the head has a loss region, with (``True``) the loss region
    in ``chunk`` anchors and ``assign_chunk`` objects per chunk (None: their defaults), each calibrated on a copy of
    ``model`` with or without it (:func:`calibrate_loss`, which measures ``model.loss`` as patched) under ``amp``.

    Raises:
        ValueError: for a bad ``chunk`` or ``assign_chunk`` (:func:`yolo_ckpt.checkpointing.chunks.check_loss_chunk`,
            :func:`yolo_ckpt.checkpointing.chunks.check_assign_chunk`).
    """
    chunk = check_loss_chunk(DEFAULT_CHUNK if chunk is None else chunk)
    objects = check_assign_chunk(DEFAULT_ASSIGN_CHUNK if assign_chunk is None else assign_chunk)
    variants = {False: None, True: (chunk, objects)} if ModelLayout.from_model(model).has_loss_region else {False: None}
    models = {}
    for on, region in variants.items():
        variant = model
        applied = (getattr(model, "loss_chunk", None), getattr(model, "assign_chunk", None))
        if applied != (region or (None, None)):  # the loss region is on, or off, where it must not be
            with one_thread():  # a copy is memory-bound: yolo_ckpt.memory.threads
                variant = copy.deepcopy(model)
            remove_loss_region(variant)
            if on:
                apply_loss_region(variant, *region)
        models[on] = calibrate_loss(variant, amp)
    return models
