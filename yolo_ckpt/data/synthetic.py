"""Deterministic synthetic aerial datasets for every Ultralytics task, of the scenes :mod:`yolo_ckpt.data.aerial` paints.

They serve as the built-in default dataset of the CLI and as test data for detect, segment, obb, pose, classify,
semantic (per-pixel ground/road/building/vehicle masks) and depth (metric depth maps of the same scenes seen from a
drone), since the installed Ultralytics ships no data for most of them and downloads are disabled. The other built-in
sets: dense nuclei for segmentation (:mod:`yolo_ckpt.data.dense`) and small objects (:mod:`yolo_ckpt.data.small_objects`).

Datasets are generated on first use into a cache folder and reused afterwards (:mod:`yolo_ckpt.data.cache`). The same
seed always yields byte-identical images and labels (for given numpy and OpenCV versions, which own the RNG and the
JPEG encoder).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import yaml

from ..errors import ConfigError
from .aerial import IMAGE_SIZE, fixed, line_ends, scene, scene_layers
from .cache import GENERATOR_VERSION, cache_root, imwrite, staged

__all__ = [
    "CLASS_NAMES",
    "CLS_TRAIN_PER_CLASS",
    "DEPTH_SCALE",
    "CLS_VAL_PER_CLASS",
    "SEMANTIC_NAMES",
    "TASKS",
    "TRAIN_IMAGES",
    "VAL_IMAGES",
    "synthetic_dataset",
]

TASKS = ("detect", "segment", "obb", "pose", "classify", "semantic", "depth")
TRAIN_IMAGES = 8  # per detect/segment/obb/pose dataset
VAL_IMAGES = 4
CLS_TRAIN_PER_CLASS = 4  # classify: scenes per class and split
CLS_VAL_PER_CLASS = 2
CLASS_NAMES = ("car", "truck", "bus")
SEMANTIC_NAMES = ("ground", "road", "building", *CLASS_NAMES)  # semantic: one class id per pixel, in this order
DEPTH_SCALE = 1000  # depth: uint16 PNG value per metre (Ultralytics' depth_scale, its default)

_CLASSIFY_OFFSET = 1000  # RNG stream offset keeping classify scenes apart from the detection scenes
_DETECT_CLASS_PROBS = (0.6, 0.25, 0.15)  # car, truck, bus: cars dominate real traffic
_DEPTH_STREAM = 1  # depth: building heights and camera tilt come from a stream of their own, so scenes stay shared
_ALTITUDE_M = 40.0  # depth: the camera's height above the ground at the image centre
_VEHICLE_HEIGHT_M = (1.5, 3.5, 3.2)  # depth: car, truck, bus roof heights


def synthetic_dataset(task: str = "detect", *, seed: int = 0, root: str | Path | None = None) -> Path:
    """Return a synthetic aerial dataset for ``task``, generating it into the cache on first use.

    Each detect/segment/obb/pose dataset holds ``TRAIN_IMAGES`` train and ``VAL_IMAGES`` val images of
    ``IMAGE_SIZE`` x ``IMAGE_SIZE`` pixels (JPEG, BGR scenes) in ``images/{train,val}`` with one label file per
    image in ``labels/{train,val}``; these four tasks share the same scenes for a given seed. Labels are normalised
    to [0, 1] and clipped to the image:

    - detect: ``cls xc yc w h`` (axis-aligned box around the rotated vehicle)
    - segment: ``cls x1 y1 ... xn yn`` (vehicle rectangle clipped to the image, n >= 4)
    - obb: ``cls x1 y1 x2 y2 x3 y3 x4 y4`` (the four corners, front-left first, cyclic)
    - pose: ``cls xc yc w h fx fy 2 rx ry 2`` (front and rear centre keypoints, ``kpt_shape: [2, 3]``)

    The classify dataset holds ``CLS_TRAIN_PER_CLASS`` train and ``CLS_VAL_PER_CLASS`` val scenes per class in
    ``{train,val}/<class>/*.jpg``; every vehicle in such a scene belongs to that class.

    The semantic and depth datasets hold the same scenes, with dense targets in Ultralytics' on-disk formats
    (``SemanticDataset``, ``DepthDataset``): semantic ``masks/{train,val}/<stem>.png``, 8-bit, one class id of
    ``SEMANTIC_NAMES`` per pixel (``masks_dir: masks`` in data.yaml); depth ``depth/{train,val}/<stem>.png``, 16-bit,
    metres x ``DEPTH_SCALE`` (``depth_scale`` in data.yaml): a tilted drone view 40 m above the ground at the image
    centre (up to 16 m deeper or nearer per image side), with buildings 6-20 m and vehicles 1.5-3.5 m tall.

    Args:
        task: One of ``TASKS``.
        seed: Non-negative integer; equal seeds give byte-identical datasets, different seeds different ones.
        root: Cache folder. Defaults to ``$YOLO_CKPT_CACHE`` or, if unset, ``~/.cache/yolo_ckpt``. The dataset
            lives in ``<root>/synthetic-v<GENERATOR_VERSION>-seed<seed>-<task>``.

    Returns:
        The absolute path of ``data.yaml`` (with absolute ``path:``, ``train``, ``val``, ``names``, and for pose
        ``kpt_shape``/``flip_idx``, semantic ``masks_dir``, depth ``depth_scale``) for every task but classify; the
        dataset directory for classify.

    Raises:
        ValueError: If ``task`` is not in ``TASKS`` or ``seed`` is negative; raised before anything is written.
        TypeError: If ``seed`` is not an integer.
        OSError: If the cache folder or an image cannot be written.
    """
    if task not in TASKS:
        raise ConfigError(f"no built-in synthetic dataset for task {task!r} (built in: {', '.join(TASKS)}); give data=")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ConfigError(f"seed must be non-negative, got {seed}")
    seed = int(seed)

    final = cache_root(root) / f"synthetic-v{GENERATOR_VERSION}-seed{seed}-{task}"
    result = final if task == "classify" else final / "data.yaml"
    if final.is_dir():  # only ever created by the atomic rename of staged, so it is complete
        return result
    with staged(final) as tmp:
        if task == "classify":
            _write_classify(tmp, seed)
        elif task in ("semantic", "depth"):
            _write_dense(tmp, final, task, seed)
        else:
            _write_labelled(tmp, final, task, seed)
    return result


def _write_labelled(tmp: Path, final: Path, task: str, seed: int) -> None:
    """Write images, labels and data.yaml for detect/segment/obb/pose into ``tmp`` (later renamed to ``final``)."""
    splits = (("train", range(TRAIN_IMAGES)), ("val", range(TRAIN_IMAGES, TRAIN_IMAGES + VAL_IMAGES)))
    for split, offsets in splits:
        (tmp / "images" / split).mkdir(parents=True)
        (tmp / "labels" / split).mkdir(parents=True)
        for i, offset in enumerate(offsets):
            # The stream depends only on (seed, image), not on the task, so the four tasks share scenes.
            image, corners, classes = scene(np.random.default_rng((seed, offset)), _DETECT_CLASS_PROBS)
            stem = f"{split}_{i:03d}"
            imwrite(tmp / "images" / split / f"{stem}.jpg", image)
            (tmp / "labels" / split / f"{stem}.txt").write_text(_labels(task, corners, classes))

    data = {
        "path": str(final),  # the folder's name after the rename, not the temporary one
        "train": "images/train",
        "val": "images/val",
        "names": dict(enumerate(CLASS_NAMES)),
    }
    if task == "pose":
        data["kpt_shape"] = [2, 3]
        data["flip_idx"] = [0, 1]  # front/rear keypoints do not swap under a horizontal flip
    (tmp / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None))


def _write_classify(tmp: Path, seed: int) -> None:
    """Write ``{train,val}/<class>/*.jpg`` single-class scenes into ``tmp``."""
    for cls, name in enumerate(CLASS_NAMES):
        probs = tuple(float(k == cls) for k in range(len(CLASS_NAMES)))
        base = _CLASSIFY_OFFSET + cls * (CLS_TRAIN_PER_CLASS + CLS_VAL_PER_CLASS)
        for split, first, count in (("train", 0, CLS_TRAIN_PER_CLASS), ("val", CLS_TRAIN_PER_CLASS, CLS_VAL_PER_CLASS)):
            folder = tmp / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image, _, _ = scene(np.random.default_rng((seed, base + first + i)), probs)
                imwrite(folder / f"{name}_{i:03d}.jpg", image)


def _write_dense(tmp: Path, final: Path, task: str, seed: int) -> None:
    """Write images, dense targets (semantic masks or depth maps) and data.yaml into ``tmp`` (later ``final``)."""
    folder = "masks" if task == "semantic" else "depth"
    splits = (("train", range(TRAIN_IMAGES)), ("val", range(TRAIN_IMAGES, TRAIN_IMAGES + VAL_IMAGES)))
    for split, offsets in splits:
        (tmp / "images" / split).mkdir(parents=True)
        (tmp / folder / split).mkdir(parents=True)
        for i, offset in enumerate(offsets):
            image, corners, classes, roads, buildings = scene_layers(np.random.default_rng((seed, offset)), _DETECT_CLASS_PROBS)
            mask = _semantic_mask(corners, classes, roads, buildings)
            if task == "semantic":
                target = mask
            else:
                target = _depth_map(mask, buildings, np.random.default_rng((seed, offset, _DEPTH_STREAM)))
            stem = f"{split}_{i:03d}"
            imwrite(tmp / "images" / split / f"{stem}.jpg", image)
            if not cv2.imwrite(str(tmp / folder / split / f"{stem}.png"), target):  # PNG: lossless
                raise OSError(f"could not write {task} target {tmp / folder / split / stem}.png")
    data = {"path": str(final), "train": "images/train", "val": "images/val"}
    if task == "semantic":
        data.update(masks_dir="masks", names=dict(enumerate(SEMANTIC_NAMES)))
    else:
        data.update(nc=1, names={0: "depth"}, depth_scale=DEPTH_SCALE)
    (tmp / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None))


def _semantic_mask(corners: np.ndarray, classes: np.ndarray, roads: np.ndarray, buildings: np.ndarray) -> np.ndarray:
    """(IMAGE_SIZE, IMAGE_SIZE) uint8 class ids of ``SEMANTIC_NAMES``: ground, then roads (their asphalt width),
    buildings and vehicles drawn over it, as :func:`yolo_ckpt.data.aerial.scene` paints them."""
    mask = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    for px, py, dx, dy, w in roads:
        cv2.line(mask, *line_ends(px, py, dx, dy, 0.0), 1, int(w))
    mask[buildings > 0] = 2
    for quad, cls in zip(corners, classes):
        cv2.fillConvexPoly(mask, fixed(quad), 3 + int(cls), cv2.LINE_8, 4)
    return mask


def _depth_map(mask: np.ndarray, buildings: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(IMAGE_SIZE, IMAGE_SIZE) uint16 depth in metres x ``DEPTH_SCALE``: a camera ``_ALTITUDE_M`` above the image
    centre's ground, tilted (the ground's depth changes by up to 16 m per image side, along a random direction),
    each building 6-20 m tall, vehicles ``_VEHICLE_HEIGHT_M`` tall."""
    yy, xx = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float32) / IMAGE_SIZE - 0.5
    angle = rng.uniform(0, 2 * np.pi)
    depth = _ALTITUDE_M + rng.uniform(-16, 16) * (xx * np.cos(angle) + yy * np.sin(angle))
    count, roofs = cv2.connectedComponents(buildings)
    heights = np.concatenate([[0.0], rng.uniform(6, 20, count - 1)]).astype(np.float32)
    depth -= heights[roofs]
    for cls, height in enumerate(_VEHICLE_HEIGHT_M):
        depth[mask == 3 + cls] -= height
    return np.round(depth * DEPTH_SCALE).astype(np.uint16)


def _labels(task: str, corners: np.ndarray, classes: np.ndarray) -> str:
    """Format vehicles as Ultralytics label lines.

    Args:
        task: detect, segment, obb or pose.
        corners: (N, 4, 2) float pixel corners, cyclic, front-left and front-right first.
        classes: (N,) int class indices.

    Returns:
        One line per vehicle, coordinates normalised by ``IMAGE_SIZE`` and clipped to [0, 1].
    """
    s = float(IMAGE_SIZE)
    lines = []
    for quad, cls in zip(corners, classes):
        x0, y0 = np.clip(quad.min(0), 0, s)
        x1, y1 = np.clip(quad.max(0), 0, s)
        box = ((x0 + x1) / 2 / s, (y0 + y1) / 2 / s, (x1 - x0) / s, (y1 - y0) / s)
        if task == "detect":
            fields = [f"{v:.6f}" for v in box]
        elif task == "segment":
            fields = [f"{v:.6f}" for v in np.clip(_clip_to_image(quad) / s, 0, 1).ravel()]
        elif task == "obb":
            fields = [f"{v:.6f}" for v in np.clip(quad / s, 0, 1).ravel()]
        else:  # pose
            fields = [f"{v:.6f}" for v in box]
            for point in (quad[:2].mean(0), quad[2:].mean(0)):  # front centre, rear centre
                fields += [f"{v:.6f}" for v in np.clip(point / s, 0, 1)] + ["2"]
        lines.append(f"{cls} " + " ".join(fields))
    return "".join(f"{line}\n" for line in lines)


def _clip_to_image(quad: np.ndarray) -> np.ndarray:
    """Intersect a (4, 2) pixel rectangle whose centre lies inside the image with the image square.

    Clamping coordinates would distort a rectangle cut by the border, so the exact intersection is used. The
    centre is the midpoint of both diagonals, so at least one corner of each diagonal stays inside, and the
    result has 4-8 vertices: (K, 2) float64 pixels, K >= 4.
    """
    if quad.min() >= 0 and quad.max() <= IMAGE_SIZE:
        return quad
    square = np.array([[0, 0], [IMAGE_SIZE, 0], [IMAGE_SIZE, IMAGE_SIZE], [0, IMAGE_SIZE]], np.float32)
    _, poly = cv2.intersectConvexConvex(quad.astype(np.float32), square)
    return poly.reshape(-1, 2).astype(np.float64)
