"""The synthetic training batch: a fixed, preprocessed batch for any task and class count, as Ultralytics' collate
gives it, with its objects laid on a grid (or given as boxes), built from shapes and broadcasts only, so that it
builds on fake tensors too. The measured step (:func:`yolo_ckpt.memory.step.profile_step`), the loss calibration and
the fake pass (:mod:`yolo_ckpt.memory.estimate`) all train on it.
"""

from __future__ import annotations

import math

import torch

from .ultralytics_rules import input_channels, mask_ratio, model_task


def training_batch(
    model, batch: int, imgsz: int, objects: int, seed: int = 0, sides: tuple[float, float] | None = None, boxes: torch.Tensor | None = None
) -> dict:
    """A fixed, preprocessed training batch for ``model``'s task and class count, as Ultralytics' collate gives it.

    ``img`` is (batch, C, imgsz, imgsz) in [0, 1], C the model's input channels
    (:func:`~yolo_ckpt.memory.ultralytics_rules.input_channels`: 1 for grayscale data, 3 for colour, any other count).
    Detection-style tasks get ``objects`` boxes per image, laid on a grid of ceil(sqrt(objects)) cells per side, one
    object per cell filling 90-100 % of it: boxes do not overlap, so each object can claim its own ``topk`` anchors,
    the case the segmentation-loss formula bounds. With ``sides`` (lo, hi), each box's width and height are drawn in
    [lo, hi] of the image side instead (small objects: 0.01 to 0.03), still centred in its cell (larger than a cell,
    neighbours overlap). ``boxes`` (batch * objects, 4), normalised xywh, image by image, replaces the grid (any
    layout: overlapping, nested, on the edges); the masks, keypoints and angles follow them as they follow the grid's.
    Classes are drawn from the model's ``nc`` (one-class models get class 0). Per task:

    - detect: ``batch_idx`` (n,), ``cls`` (n, 1), ``bboxes`` (n, 4) normalised xywh, with n = batch * objects;
    - segment: also ``masks`` (batch, imgsz/r, imgsz/r) with r the model's ``args.mask_ratio`` (default 4), each
      object's box filled with its index + 1 (Ultralytics' default ``overlap_mask=True``; uint8, int32 past 255
      objects, as its dataset stores them; with ``args.overlap_mask=False`` one (n, imgsz/r, imgsz/r) float mask
      per object) and ``sem_masks`` (batch, imgsz/r, imgsz/r) float;
    - pose: also ``keypoints`` (n, K, 3) (normalised xy inside the box, visibility 2), K from the head's
      ``kpt_shape``;
    - obb: ``bboxes`` (n, 5) normalised xywh and an angle in radians;
    - classify: ``cls`` (batch,) int64 (no objects);
    - semantic: ``semantic_mask`` (batch, imgsz, imgsz) int32 class ids in [0, nc), every pixel valid (none the
      ignore id 255), as ``SemanticFormat`` gives the loss (no objects);
    - depth: ``depth`` (batch, 1, imgsz, imgsz) float32 metres in [1, 80], every pixel valid (> 0.001), as
      ``DepthFormat`` and ``DepthTrainer.preprocess_batch`` give it (no objects).

    Every pixel of a dense target is valid: the losses gather the valid pixels, so that is their largest step.

    Built from shapes and broadcasts only, so it also builds on fake tensors (``FakeTensorMode``).

    Raises:
        ValueError: for a task that is not modelled (see :func:`~yolo_ckpt.memory.ultralytics_rules.model_task`), or
            objects < 1 for a task with boxes.
    """
    task = model_task(model)
    head = model.model[-1]
    nc = int(getattr(head, "nc", None) or model.yaml["nc"])
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(batch, input_channels(model), imgsz, imgsz, generator=g)
    if task == "classify":
        return {"img": images, "cls": torch.randint(0, nc, (batch,), generator=g)}
    if task == "semantic":
        return {"img": images, "semantic_mask": torch.randint(0, nc, (batch, imgsz, imgsz), generator=g, dtype=torch.int32)}
    if task == "depth":
        return {"img": images, "depth": torch.rand(batch, 1, imgsz, imgsz, generator=g) * 79 + 1}
    if objects < 1:
        raise ValueError(f"objects={objects}: a {task} batch needs at least 1 object per image")
    out = {"img": images, **_grid_targets(batch, objects, nc, g, sides)}
    if boxes is not None:
        out["bboxes"] = boxes.float().reshape(batch * objects, 4)
    xywh = out["bboxes"]
    if task == "obb":
        out["bboxes"] = torch.cat([xywh, torch.rand(len(xywh), 1, generator=g) * math.pi / 2], 1)
    elif task == "pose":
        k = int(head.kpt_shape[0])
        xy = xywh[:, None, :2] + (torch.rand(len(xywh), k, 2, generator=g) - 0.5) * xywh[:, None, 2:]
        out["keypoints"] = torch.cat([xy, torch.full((len(xywh), k, 1), 2.0)], 2)
    elif task == "segment":
        overlap = getattr(getattr(model, "args", None), "overlap_mask", True)
        ratio = mask_ratio(model)
        out.update(_grid_masks(batch, imgsz // ratio, objects, xywh, overlap))
    return out


def detect_batch(batch: int, imgsz: int, objects: int, seed: int = 0, nc: int = 1) -> dict:
    """A fixed detection training batch (:func:`training_batch`'s detect batch) for a 3-channel model of ``nc``
    classes, without the model: (batch, 3, imgsz, imgsz) images in [0, 1], ``objects`` grid-laid boxes per image."""
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.rand(batch, 3, imgsz, imgsz, generator=g), **_grid_targets(batch, objects, nc, g)}


def _grid_targets(batch: int, objects: int, nc: int, g: torch.Generator, sides: tuple[float, float] | None = None) -> dict:
    """``batch_idx``, ``cls`` and normalised xywh ``bboxes`` of ``objects`` boxes per image, one per grid cell,
    filling 90-100 % of it or, with ``sides`` (lo, hi), of sides in [lo, hi] (fractions of the image side)."""
    side = math.ceil(math.sqrt(objects))
    cell = torch.arange(objects).repeat(batch)
    centre = (torch.stack([cell % side, cell // side], 1) + 0.5) / side
    u = torch.rand(len(cell), 2, generator=g)
    wh = (u * 0.1 + 0.9) / side if sides is None else u * (sides[1] - sides[0]) + sides[0]
    return {
        "batch_idx": torch.arange(batch).repeat_interleave(objects).float(),
        "cls": torch.randint(0, nc, (len(cell), 1), generator=g).float(),
        "bboxes": torch.cat([centre, wh], 1),
    }


def _grid_masks(batch: int, size: int, objects: int, xywh: torch.Tensor, overlap: bool) -> dict:
    """Instance masks at ``size`` x ``size`` (the prototypes' resolution) filling each box, by broadcasting."""
    pixel = (torch.arange(size) + 0.5) / size
    lo, hi = xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2
    inside_x = (pixel >= lo[:, :1]) & (pixel < hi[:, :1])  # (n, size)
    inside_y = (pixel >= lo[:, 1:]) & (pixel < hi[:, 1:])
    inside = inside_y[:, :, None] & inside_x[:, None, :]  # (n, size, size)
    if overlap:
        index = torch.arange(1, objects + 1).repeat(batch)[:, None, None]
        dtype = torch.int32 if objects > 255 else torch.uint8
        masks = (inside * index).view(batch, objects, size, size).amax(1).to(dtype)
    else:
        masks = inside.float()
    return {"masks": masks, "sem_masks": torch.zeros(batch, size, size)}
