"""Small-object detection data (:func:`small_object_dataset`): one class of 5 px crosses among distractors of the same
size and colours (rings, dots), told apart at full resolution, blurred into alike 2-3 px blobs once the image is
downscaled, which is what the accuracy-at-equal-memory benchmark (``yolo_ckpt/cfg/bench/small-objects.yaml``) needs."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import yaml

from .cache import GENERATOR_VERSION, cache_root, check_ints, imwrite, staged

__all__ = ["SMALL_OBJECT_PX", "small_object_dataset"]

SMALL_OBJECT_PX = 5  # small_object_dataset: side of every cross and distractor, pixels at full resolution
_SMALL_CELL = 16  # small_object_dataset: objects sit one per cell of a 16 px grid, so none touch
# small_object_dataset shapes, SMALL_OBJECT_PX square, 1 = lit: the class (a cross) and its look-alike distractors.
_CROSS = np.zeros((SMALL_OBJECT_PX, SMALL_OBJECT_PX), bool)
_CROSS[SMALL_OBJECT_PX // 2, :] = _CROSS[:, SMALL_OBJECT_PX // 2] = True
_RING = np.ones_like(_CROSS)
_RING[1:-1, 1:-1] = False
_DOT = np.zeros_like(_CROSS)
_DOT[1:-1, 1:-1] = True  # 3 x 3 filled: as many lit pixels as the cross, so a blurred dot looks like a blurred cross
_SMALL_SHAPES = (_CROSS, _RING, _DOT)


def small_object_dataset(
    size: int = 320, train: int = 48, val: int = 12, *, seed: int = 0, root: str | Path | None = None
) -> Path:
    """A one-class small-object detection dataset, generated once into the cache: ``train`` and ``val`` images of
    ``size`` x ``size`` px, each with 20-60 crosses (class ``cross``, ``SMALL_OBJECT_PX`` px square boxes) among
    40-100 distractors of the same size and colours (hollow squares, 3 px dots) per 320 x 320 px (at least one
    cross), on a cluttered background (smooth colour fields, grain and thin lines).

    At full resolution a cross is told from a distractor by its shape; downscaled to 0.7x (224 of 320 px: where
    ``imgsz=fit`` puts recompute=none of YOLO26n under the budget that recompute=all needs at full size) every shape
    becomes an alike 3-4 px blob; at ``size=640`` (``yolo_ckpt/cfg/bench/small-objects-640.yaml``: 80-240 crosses per image)
    the budget of recompute=all at 640 puts stock at 416 (0.65x).
    Objects sit one per cell of a 16 px grid (jittered), so boxes never touch. Same arguments give byte-identical
    files. Labels: ``0 xc yc w h`` normalised.

    Returns:
        The absolute path of its ``data.yaml`` (in ``<root>/small-v<GENERATOR_VERSION>-seed<seed>-<size>x<train>+<val>``).

    Raises:
        ValueError: unless ``size`` is an int >= 64, ``train`` and ``val`` ints >= 1 and ``seed`` an int >= 0;
            raised before anything is written.
    """
    check_ints(("size", size, 64), ("train", train, 1), ("val", val, 1), ("seed", seed, 0))
    final = cache_root(root) / f"small-v{GENERATOR_VERSION}-seed{seed}-{size}x{train}+{val}"
    if final.is_dir():
        return final / "data.yaml"
    with staged(final) as tmp:
        for split, count in (("train", train), ("val", val)):
            (tmp / "images" / split).mkdir(parents=True)
            (tmp / "labels" / split).mkdir(parents=True)
            for i in range(count):
                image, boxes = _small_scene(np.random.default_rng((seed, split == "val", i)), size)
                imwrite(tmp / "images" / split / f"{i:03d}.jpg", image)
                rows = [" ".join(f"{v:.6f}" for v in box / size) for box in boxes]
                (tmp / "labels" / split / f"{i:03d}.txt").write_text("".join(f"0 {r}\n" for r in rows))
        data = {"path": str(final), "train": "images/train", "val": "images/val", "names": {0: "cross"}}
        (tmp / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return final / "data.yaml"


def _small_scene(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One :func:`small_object_dataset` image: (size, size, 3) uint8 BGR and the crosses' (N, 4) pixel boxes
    ``xc yc w h``."""
    lo = max(size // 64, 2)  # smooth colour fields: a coarse random grid upsampled
    image = cv2.resize(rng.uniform(50, 150, (lo, lo, 3)).astype(np.float32), (size, size), interpolation=cv2.INTER_CUBIC)
    for _ in range(rng.integers(10, 30)):  # thin lines of the objects' colours: edges the model must not fire on
        a, b = rng.integers(0, size, 2), rng.integers(0, size, 2)
        cv2.line(image, tuple(map(int, a)), tuple(map(int, b)), rng.uniform(170, 250, 3).tolist(), 1)
    side = size // _SMALL_CELL
    per_400 = side * side / 400  # the counts below are per 400 cells (a 320 px image), scaled to this image
    crosses, distractors = max(int(rng.integers(20, 61) * per_400), 1), int(rng.integers(40, 101) * per_400)
    cells = rng.permutation(side * side)[: crosses + distractors]
    kinds = np.r_[np.zeros(crosses, np.int64), rng.integers(1, len(_SMALL_SHAPES), distractors)]
    corner = np.stack([cells % side, cells // side], 1) * _SMALL_CELL + rng.integers(0, _SMALL_CELL - SMALL_OBJECT_PX + 1, (len(cells), 2))
    for (x, y), kind in zip(corner, kinds):
        patch = image[y : y + SMALL_OBJECT_PX, x : x + SMALL_OBJECT_PX]
        patch[_SMALL_SHAPES[kind]] = rng.uniform(170, 250, 3)  # one colour per object, shared by the three shapes
    image += rng.normal(0, 8, image.shape).astype(np.float32)  # sensor grain
    boxes = np.c_[corner[:crosses] + SMALL_OBJECT_PX / 2, np.full((crosses, 2), SMALL_OBJECT_PX)].astype(np.float64)
    return np.clip(image, 0, 255).astype(np.uint8), boxes
