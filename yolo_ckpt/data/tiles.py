"""Cut an Ultralytics detection dataset into tiles: what users do instead of training at full resolution.

:func:`tile_dataset` writes a new dataset of overlapping square tiles (SAHI-style slicing, as in
ultralytics#17488) from a detection dataset's train and val images, with the boxes clipped to each tile. The
source dataset is only read. A model trained on tiles sees objects at their full-resolution size in small
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

__all__ = ["MIN_VISIBLE", "dataset_root", "split_images", "tile_dataset", "tile_starts"]

MIN_VISIBLE = 0.5  # a box is kept in a tile when at least this fraction of its area lies inside the tile


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


def tile_dataset(data, out, size: int, overlap: int, imgsz: int | None = None) -> Path:
    """Write the tile dataset of a detection dataset into the new folder ``out`` and return its ``data.yaml``.

    Each train and val image is first resized (when ``imgsz`` is given) so that its long side is ``imgsz`` px, as
    Ultralytics loads it for training at that imgsz, then cut into ``size`` x ``size`` px tiles at the offsets of
    :func:`tile_starts` along each side (neighbours overlap by at least ``overlap`` px), written lossless as
    ``images/<split>/<stem>_<x>_<y>.png``. Each box (``cls xc yc w h``, normalised) is clipped to every tile it
    touches and kept there when at least ``MIN_VISIBLE`` of its area lies inside; labels are normalised to the tile.
    The yaml keeps the source's ``names``. Nothing of the source is written (its label caches included).

    Raises:
        ValueError: for ``size`` < 32, ``overlap`` outside [0, size / 2], ``imgsz`` < ``size``, a source that is not
            a detection dataset (label lines of 5 fields), or an ``out`` that exists or lies inside the source;
            FileNotFoundError: for a missing data.yaml or a split without images. All before anything is written.
    """
    data, out = Path(data), Path(out).resolve()
    if isinstance(size, bool) or not isinstance(size, int) or size < 32:
        raise ConfigError(f"tile size={size!r} must be an int >= 32 (px)")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= size // 2:
        raise ConfigError(f"tile overlap={overlap!r} must be an int in [0, {size // 2}] (px, at most half the tile)")
    if imgsz is not None and (isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz < size):
        raise ConfigError(f"imgsz={imgsz!r} must be None or an int >= the tile size {size}")
    if not data.is_file():
        raise MissingFileError(f"data={data}: no such data.yaml")
    spec, root = dataset_root(data)
    if out.exists() or out.is_relative_to(root):
        raise ConfigError(f"out={out} must be a new folder outside the source dataset {root}")
    sources = {split: split_images(root, spec[split]) for split in ("train", "val")}
    for split, images in sources.items():
        if not images:
            raise MissingFileError(f"data={data}: no {split} images found under {root / str(spec[split])}")
    labels = {split: [_read_boxes(Path(f)) for f in img2label_paths([str(p) for p in images])] for split, images in sources.items()}
    with staged(out) as tmp:
        for split, images in sources.items():
            (tmp / "images" / split).mkdir(parents=True)
            (tmp / "labels" / split).mkdir(parents=True)
            for image_path, boxes in zip(images, labels[split]):
                _write_tiles(tmp, split, image_path, boxes, size, overlap, imgsz)
        YAML.save(tmp / "data.yaml", {"path": str(out), "train": "images/train", "val": "images/val", "names": spec["names"]})
    return out / "data.yaml"


def _read_boxes(label: Path) -> np.ndarray:
    """(N, 5) float64 ``cls xc yc w h`` of a detection label file (none when it is missing or empty).

    Raises:
        ValueError: for a line without exactly 5 fields (segment, pose or obb labels)."""
    rows = [line.split() for line in label.read_text().splitlines() if line.strip()] if label.is_file() else []
    bad = [r for r in rows if len(r) != 5]
    if bad:
        raise ConfigError(f"{label}: the tiler takes detection labels 'cls xc yc w h'; got a line of {len(bad[0])} fields")
    return np.array(rows, np.float64).reshape(-1, 5)


def _write_tiles(tmp: Path, split: str, image_path: Path, boxes: np.ndarray, size: int, overlap: int, imgsz) -> None:
    """Write the tiles of one image and their labels (see :func:`tile_dataset`)."""
    image = cv2.imread(str(image_path))
    if image is None:
        raise OSError(f"could not read image {image_path}")
    h, w = image.shape[:2]
    if imgsz is not None and max(h, w) != imgsz:  # as Ultralytics' BaseDataset.load_image resizes (long side)
        r = imgsz / max(h, w)
        h, w = min(math.ceil(h * r), imgsz), min(math.ceil(w * r), imgsz)
        image = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)
    xyxy = np.c_[(boxes[:, 1:3] - boxes[:, 3:5] / 2), (boxes[:, 1:3] + boxes[:, 3:5] / 2)] * [w, h, w, h]
    area = np.prod(xyxy[:, 2:] - xyxy[:, :2], 1)
    for y in tile_starts(h, size, overlap):
        for x in tile_starts(w, size, overlap):
            tile = image[y : y + size, x : x + size]
            th, tw = tile.shape[:2]
            clipped = np.clip(xyxy - [x, y, x, y], 0, [tw, th, tw, th])
            inside = np.prod(np.clip(clipped[:, 2:] - clipped[:, :2], 0, None), 1)
            keep = (inside > 0) & (inside >= MIN_VISIBLE * area)
            c = clipped[keep]
            rows = np.c_[boxes[keep, 0], (c[:, :2] + c[:, 2:]) / 2 / [tw, th], (c[:, 2:] - c[:, :2]) / [tw, th]]
            stem = f"{image_path.stem}_{x}_{y}"
            if not cv2.imwrite(str(tmp / "images" / split / f"{stem}.png"), tile):
                raise OSError(f"could not write tile {tmp / 'images' / split / stem}.png")
            text = "".join(f"{int(r[0])} " + " ".join(f"{v:.6f}" for v in r[1:]) + "\n" for r in rows)
            (tmp / "labels" / split / f"{stem}.txt").write_text(text)
