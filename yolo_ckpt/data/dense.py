"""Dense segmentation data: microscopy-like images with hundreds of small, non-overlapping nuclei each, where the mask
loss holds the training peak: a dataset in the cache (:func:`dense_segment_dataset`) and a fixed training batch
(:func:`dense_segment_batch`)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import yaml

from .aerial import fixed
from .cache import GENERATOR_VERSION, cache_root, check_ints, imwrite, staged

__all__ = ["dense_segment_batch", "dense_segment_dataset"]


def _nuclei(rng: np.random.Generator, size: int, objects: int) -> np.ndarray:
    """(objects, 12, 2) float64 pixel polygons of non-overlapping ellipses ("nuclei") in a ``size`` square: one per
    cell of a jittered grid just large enough to hold them, filled in random order."""
    side = int(np.ceil(np.sqrt(objects)))
    cell = size / side
    slots = rng.permutation(side * side)[:objects]
    centre = (np.stack([slots % side, slots // side], 1) + 0.5) * cell + rng.uniform(-0.1, 0.1, (objects, 2)) * cell
    axes = rng.uniform(0.2, 0.38, (objects, 2)) * cell  # semi-axes: neighbours never touch
    angle = np.linspace(0, 2 * np.pi, 12, endpoint=False)
    ring = np.stack([np.cos(angle), np.sin(angle)], 1)
    return centre[:, None, :] + ring[None] * axes[:, None, :]


def dense_segment_dataset(
    objects: int = 200, size: int = 256, images: int = 4, *, seed: int = 0, root: str | Path | None = None
) -> Path:
    """A dense segmentation dataset: ``images`` train and one val ``size`` px microscopy-like images with
    ``objects`` nuclei each (``cls x1 y1 ... x12 y12`` polygon labels, one class), generated once into the cache.

    Returns:
        The absolute path of its ``data.yaml``.

    Raises:
        ValueError: unless ``objects``, ``size`` and ``images`` are positive ints and ``size >= 32``.
    """
    check_ints(("objects", objects, 1), ("size", size, 32), ("images", images, 1))
    final = cache_root(root) / f"dense-v{GENERATOR_VERSION}-seed{seed}-{objects}x{size}x{images}+1"
    if final.is_dir():
        return final / "data.yaml"
    with staged(final) as tmp:
        for split, count in (("train", images), ("val", 1)):
            (tmp / "images" / split).mkdir(parents=True)
            (tmp / "labels" / split).mkdir(parents=True)
            for i in range(count):
                rng = np.random.default_rng((seed, split == "val", i))
                image = np.full((size, size, 3), 215, np.int16) + rng.integers(-12, 13, (size, size, 3), dtype=np.int16)
                polygons = _nuclei(rng, size, objects)
                for polygon in polygons:  # stained nuclei: dark purple on a pale background
                    cv2.fillPoly(image, [fixed(polygon)], (150, 60, 120), cv2.LINE_AA, 4)
                imwrite(tmp / "images" / split / f"{i:03d}.jpg", np.clip(image, 0, 255).astype(np.uint8))
                rows = ["0 " + " ".join(f"{v:.6f}" for v in np.clip(p / size, 0, 1).ravel()) for p in polygons]
                (tmp / "labels" / split / f"{i:03d}.txt").write_text("".join(f"{r}\n" for r in rows))
        data = {"path": str(final), "train": "images/train", "val": "images/val", "names": {0: "nucleus"}}
        (tmp / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return final / "data.yaml"


def dense_segment_batch(
    batch: int, imgsz: int, objects: int, overlap: bool = True, mask_ratio: int = 4, seed: int = 0
) -> dict:
    """A fixed segmentation training batch of dense nuclei, as Ultralytics' segmentation collate makes it.

    Returns:
        ``img`` (batch, 3, imgsz, imgsz) float in [0, 1], ``batch_idx`` (n,), ``cls`` (n, 1) zeros, ``bboxes``
        (n, 4) normalised xywh, with n = batch x objects; ``masks`` at imgsz / mask_ratio: (batch, h, w) int32 with
        ``k + 1`` on image i's k-th object when ``overlap``, else (n, h, w) uint8 0/1; ``sem_masks`` (batch, h, w)
        float class indices (all 0: one class), which YOLO26's semantic branch needs.
    """
    import torch

    rng = np.random.default_rng((seed, batch, imgsz, objects))
    h = imgsz // mask_ratio
    polygons = [_nuclei(rng, imgsz, objects) for _ in range(batch)]
    masks = np.zeros((batch, h, h) if overlap else (batch * objects, h, h), np.int32 if overlap else np.uint8)
    for i, image in enumerate(polygons):
        for k, polygon in enumerate(image):
            target = masks[i] if overlap else masks[i * objects + k]
            cv2.fillPoly(target, [fixed(polygon / mask_ratio)], k + 1 if overlap else 1, cv2.LINE_8, 4)
    corners = np.concatenate(polygons)
    lo, hi = corners.min(1), corners.max(1)
    boxes = np.concatenate([(lo + hi) / 2, hi - lo], 1) / imgsz
    return {
        "img": torch.from_numpy(rng.random((batch, 3, imgsz, imgsz), np.float32)),
        "batch_idx": torch.arange(batch).repeat_interleave(objects).float(),
        "cls": torch.zeros(batch * objects, 1),
        "bboxes": torch.from_numpy(boxes).float(),
        "masks": torch.from_numpy(masks),
        "sem_masks": torch.zeros(batch, h, h),
    }
