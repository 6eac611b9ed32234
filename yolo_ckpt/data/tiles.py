"""Cut an Ultralytics detection or segmentation dataset into tiles: what users do instead of training at full resolution.

:func:`tile_dataset` writes a new dataset of overlapping square tiles (SAHI-style slicing, as in
ultralytics#17488) from a dataset's train and val images, with each label (a box or a polygon) clipped to each
tile. The source dataset is only read. A model trained on tiles sees objects at their full-resolution size in small
inputs; it is validated on the source's full-resolution val images (``model.val(data=<source>, imgsz=<full>)``).
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
from ultralytics.data.utils import IMG_FORMATS, img2label_paths
from ultralytics.utils import YAML

from ..errors import ConfigError, MissingFileError
from .synthetic import staged

__all__ = ["MIN_VISIBLE", "TILE_TASKS", "clip_polygon", "dataset_root", "polygon_area", "split_images", "tile_dataset", "tile_starts"]

MIN_VISIBLE = 0.5  # a label is kept in a tile when at least this fraction of its area (box or polygon) lies inside the tile
TILE_TASKS = ("detect", "segment")  # label formats the tiler clips: boxes ``cls xc yc w h``, polygons ``cls x1 y1 ... xn yn``


def dataset_root(data) -> tuple[dict, Path]:
    """A data.yaml's content and its root (``path:``, relative to the yaml's folder; the folder when absent)."""
    spec = YAML.load(data)
    folder = Path(data).resolve().parent
    root = (folder / spec["path"]).resolve() if spec.get("path") else folder
    return spec, root


def split_images(root: Path, split) -> list[Path]:
    """The image files of a split (a folder, a list file, or a list of them) under ``root``, sorted."""
    files = []
    for entry in split if isinstance(split, list) else [split]:
        p = (root / entry).resolve()
        if p.is_dir():
            files += [f for f in p.rglob("*") if f.suffix[1:].lower() in IMG_FORMATS]
        elif p.is_file():
            files += [(p.parent / line.strip()).resolve() for line in p.read_text().splitlines() if line.strip()]
    return sorted(files)


def tile_starts(length: int, size: int, overlap: int) -> list[int]:
    """Start offsets (px) of the tiles covering ``length`` px with tiles of ``size`` px: the fewest tiles whose
    neighbours overlap by at least ``overlap`` px, spread evenly, the first at 0 and the last ending at ``length``.
    One tile at 0 when ``length <= size`` (that tile is the whole side, shorter than ``size``)."""
    if length <= size:
        return [0]
    n = math.ceil((length - overlap) / (size - overlap))
    return [round(i * (length - size) / (n - 1)) for i in range(n)]


def clip_polygon(points: np.ndarray, x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    """The part of a polygon inside the rectangle ``[x0, x1] x [y0, y1]``, by Sutherland-Hodgman clipping (Sutherland
    and Hodgman, "Reentrant polygon clipping", CACM 1974): against each of the rectangle's four edges in turn, keep the
    vertices on its inner side and add the points where the polygon's edges cross it.

    Exact for any simple polygon, convex or not (the rectangle is convex); a concave polygon that the rectangle cuts
    into several pieces comes back as one polygon whose pieces are joined along the rectangle's edge (zero-area
    bridges: its area and filled mask are those of the pieces).

    Args:
        points: (K, 2) float vertices (x, y), in order (either orientation), in the rectangle's units.

    Returns:
        (M, 2) float64 vertices of the clipped polygon, in the same order, no vertex repeated next to itself; M = 0
        when nothing lies inside. A crossing point lies exactly on its edge (that coordinate is the bound itself).
    """
    poly = np.asarray(points, np.float64).reshape(-1, 2)
    for axis, bound, sign in ((0, x0, 1), (0, x1, -1), (1, y0, 1), (1, y1, -1)):
        if not len(poly):
            break
        inside = sign * (poly[:, axis] - bound) >= 0
        out = []
        for prev, cur, prev_in, cur_in in zip(np.roll(poly, 1, 0), poly, np.roll(inside, 1), inside):
            if cur_in != prev_in:  # the edge prev -> cur crosses the bound
                crossing = prev + (bound - prev[axis]) / (cur[axis] - prev[axis]) * (cur - prev)
                crossing[axis] = bound
                out.append(crossing)
            if cur_in:
                out.append(cur)
        poly = np.array(out, np.float64).reshape(-1, 2)
    return poly[np.any(poly != np.roll(poly, 1, 0), 1)] if len(poly) > 1 else poly  # a vertex on a bound comes twice


def polygon_area(points: np.ndarray) -> float:
    """Area of a simple polygon ((K, 2) vertices in order; squared units of the vertices) by the shoelace formula; 0.0
    for fewer than 3 vertices."""
    x, y = np.asarray(points, np.float64).reshape(-1, 2).T
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2) if len(x) >= 3 else 0.0


def tile_dataset(data, out, size: int, overlap: int, imgsz: int | None = None, task: str = "detect") -> Path:
    """Write the tile dataset of a detection or segmentation dataset into the new folder ``out`` and return its
    ``data.yaml``.

    Each train and val image is first resized (when ``imgsz`` is given) so that its long side is ``imgsz`` px, as
    Ultralytics loads it for training at that imgsz, then cut into ``size`` x ``size`` px tiles at the offsets of
    :func:`tile_starts` along each side (neighbours overlap by at least ``overlap`` px), written lossless as
    ``images/<split>/<stem>_<x>_<y>.png``. Each label, a box (``task="detect"``: ``cls xc yc w h``) or a polygon
    (``task="segment"``: ``cls x1 y1 ... xn yn``), all normalised, is clipped to every tile it touches
    (:func:`clip_polygon`: a box is its rectangle) and kept there when its clipped area is > 0 and at least
    ``MIN_VISIBLE`` of its whole area (:func:`polygon_area`); it is written shifted and normalised to the tile, a box
    as the clipped rectangle, a polygon as the clipped polygon (whose box Ultralytics derives from its vertices, as for
    any polygon label). The yaml keeps the source's ``names``. Nothing of the source is written (its label caches
    included).

    Raises:
        ValueError: for ``size`` < 32, ``overlap`` outside [0, size / 2], ``imgsz`` < ``size``, a ``task`` not in
            ``TILE_TASKS``, a label line that is not the task's format (5 fields for detect; an odd count >= 7 for
            segment), or an ``out`` that exists or lies inside the source;
            FileNotFoundError: for a missing data.yaml or a split without images. All before anything is written.
    """
    data, out = Path(data), Path(out).resolve()
    if isinstance(size, bool) or not isinstance(size, int) or size < 32:
        raise ConfigError(f"tile size={size!r} must be an int >= 32 (px)")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= size // 2:
        raise ConfigError(f"tile overlap={overlap!r} must be an int in [0, {size // 2}] (px, at most half the tile)")
    if imgsz is not None and (isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz < size):
        raise ConfigError(f"imgsz={imgsz!r} must be None or an int >= the tile size {size}")
    if task not in TILE_TASKS:
        raise ConfigError(f"task={task!r} cannot be tiled; valid: {', '.join(TILE_TASKS)}")
    if not data.is_file():
        raise MissingFileError(f"data={data}: no such data.yaml")
    spec, root = dataset_root(data)
    if out.exists() or out.is_relative_to(root):
        raise ConfigError(f"out={out} must be a new folder outside the source dataset {root}")
    sources = {split: split_images(root, spec[split]) for split in ("train", "val")}
    for split, images in sources.items():
        if not images:
            raise MissingFileError(f"data={data}: no {split} images found under {root / str(spec[split])}")
    labels = {split: [_read_labels(Path(f), task) for f in img2label_paths([str(p) for p in images])] for split, images in sources.items()}
    with staged(out) as tmp:
        for split, images in sources.items():
            (tmp / "images" / split).mkdir(parents=True)
            (tmp / "labels" / split).mkdir(parents=True)
            for image_path, objects in zip(images, labels[split]):
                _write_tiles(tmp, split, image_path, objects, size, overlap, imgsz, task)
        YAML.save(tmp / "data.yaml", {"path": str(out), "train": "images/train", "val": "images/val", "names": spec["names"]})
    return out / "data.yaml"


def _read_labels(label: Path, task: str) -> list[tuple[int, np.ndarray]]:
    """The labels of a label file (none when it is missing or empty) as ``(cls, (K, 2) float64 normalised vertices)``:
    a detection box ``cls xc yc w h`` as its rectangle's 4 corners, a segment ``cls x1 y1 ... xn yn`` as its polygon.

    Raises:
        ValueError: for a line that is not the task's format (5 fields for detect; an odd count >= 7 for segment:
            pose and obb labels, boxes in a segment dataset)."""
    rows = [line.split() for line in label.read_text().splitlines() if line.strip()] if label.is_file() else []
    fits = (lambda n: n == 5) if task == "detect" else (lambda n: n >= 7 and n % 2 == 1)
    bad = [r for r in rows if not fits(len(r))]
    if bad:
        want = "detection labels 'cls xc yc w h'" if task == "detect" else "segment labels 'cls x1 y1 x2 y2 x3 y3 ...' (3 points or more)"
        raise ConfigError(f"{label}: the tiler takes {want} for task={task}; got a line of {len(bad[0])} fields")
    objects = []
    for row in rows:
        values = np.array(row[1:], np.float64)
        if task == "detect":
            xc, yc, w, h = values
            values = np.array([xc - w / 2, yc - h / 2, xc + w / 2, yc - h / 2, xc + w / 2, yc + h / 2, xc - w / 2, yc + h / 2])
        objects.append((int(float(row[0])), values.reshape(-1, 2)))
    return objects


def _write_tiles(tmp: Path, split: str, image_path: Path, objects: list, size: int, overlap: int, imgsz, task: str) -> None:
    """Write the tiles of one image and their labels (see :func:`tile_dataset`)."""
    image = cv2.imread(str(image_path))
    if image is None:
        raise OSError(f"could not read image {image_path}")
    h, w = image.shape[:2]
    if imgsz is not None and max(h, w) != imgsz:  # as Ultralytics' BaseDataset.load_image resizes (long side)
        r = imgsz / max(h, w)
        h, w = min(math.ceil(h * r), imgsz), min(math.ceil(w * r), imgsz)
        image = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)
    polygons = [points * [w, h] for _, points in objects]  # pixels of the (resized) image
    bounds = [(*p.min(0), *p.max(0)) for p in polygons]
    areas = [polygon_area(p) for p in polygons]
    for y in tile_starts(h, size, overlap):
        for x in tile_starts(w, size, overlap):
            tile = image[y : y + size, x : x + size]
            th, tw = tile.shape[:2]
            lines = []
            for (cls, _), points, (bx0, by0, bx1, by1), area in zip(objects, polygons, bounds, areas):
                if bx1 <= x or by1 <= y or bx0 >= x + tw or by0 >= y + th:
                    continue  # wholly outside (clipped area 0)
                whole = bx0 >= x and by0 >= y and bx1 <= x + tw and by1 <= y + th
                clipped = points if whole else clip_polygon(points, x, y, x + tw, y + th)
                inside = polygon_area(clipped)
                if inside <= 0 or inside < MIN_VISIBLE * area:
                    continue
                rel = (clipped - [x, y]) / [tw, th]
                values = np.r_[(rel.min(0) + rel.max(0)) / 2, rel.max(0) - rel.min(0)] if task == "detect" else rel.ravel()
                lines.append(f"{cls} " + " ".join(f"{v:.6f}" for v in values) + "\n")
            stem = f"{image_path.stem}_{x}_{y}"
            if not cv2.imwrite(str(tmp / "images" / split / f"{stem}.png"), tile):
                raise OSError(f"could not write tile {tmp / 'images' / split / stem}.png")
            (tmp / "labels" / split / f"{stem}.txt").write_text("".join(lines))
