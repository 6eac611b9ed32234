"""The layout bound (yolo_ckpt.memory.box_layout) against the real assigner's geometry on Ultralytics' own samples."""

import os
import random

import numpy as np
import pytest
import torch

os.environ.setdefault("YOLO_OFFLINE", "1")

from helpers import write_dataset  # noqa: E402
from ultralytics.utils import DEFAULT_CFG  # noqa: E402
from ultralytics.utils.tal import TaskAlignedAssigner  # noqa: E402

from yolo_ckpt.memory.box_layout import _lattice  # noqa: E402

STRIDES = (8.0, 16.0, 32.0)


def test_lattice_counts_anchor_centres_strictly_inside():
    """_lattice counts the points (k + 1/2) * stride strictly inside (lo, hi), a rounding tolerance's worth more at an
    edge that lies on one."""
    lo, hi = np.array([0.0, 3.9, 4.0, -19.0, 5.0]), np.array([4.1, 12.1, 12.0, 10.0, 6.0])
    assert _lattice(lo, hi, 8.0).tolist() == [1, 2, 2, 3, 0]  # 4; 4 and 12; 4 (+12 on the edge); -12,-4,4; none


def _dense_dataset(folder, images: int = 3) -> str:
    """A segment dataset of ``images`` 120 x 96 px images (letterboxed by their long side: the rounding of the short
    side), each with 50 small rectangles (2-14 px, many touching or overlapping, some across the border) and 3 large
    overlapping ones, as polygons. Returns its data.yaml (:func:`helpers.write_dataset`)."""
    g = np.random.default_rng(1)
    pixels, labels = {}, {}
    for split in ("train", "val"):
        pixels[split], labels[split] = [], []
        for _ in range(images if split == "train" else 1):
            pixels[split].append(g.integers(0, 255, (96, 120, 3), dtype=np.uint8))
            rows = []
            for k in range(53):
                w, h = (g.uniform(2, 14, 2) if k < 50 else g.uniform(40, 90, 2)) / (120, 96)
                x, y = g.uniform(0, 1, 2)
                x1, y1, x2, y2 = np.clip([x - w / 2, y - h / 2, x + w / 2, y + h / 2], 0, 1)
                rows.append(f"0 {x1} {y1} {x2} {y1} {x2} {y2} {x1} {y2}")
            labels[split].append(rows)
    return write_dataset(folder, labels, pixels, names=("thing",))


@pytest.mark.parametrize("keys", [{}, {"scale": 0.9}, {"mosaic": 0.0}, {"mixup": 0.5, "translate": 0.4}])
def test_layout_bound_never_under_ultralytics_samples(keys, tmp_path):
    """On samples Ultralytics' own training pipeline draws (mosaic or not, RandomPerspective's scales and
    translations, flips, mixup), the real assigner's geometry (select_candidates_in_gts, with its stride_val floor)
    never gives more candidate pairs, or more of each object's min(topk, candidates), than the bound from the labels'
    places (ObjectSizes.per_image through box_layout); and the bound is below the one that ignores where boxes lie."""
    import dataclasses

    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    from yolo_ckpt.memory.foreground import candidates
    from yolo_ckpt.memory.runspec import count_data

    imgsz = 128
    args = get_cfg(DEFAULT_CFG, {"task": "segment", "imgsz": imgsz, **keys})
    data = check_det_dataset(_dense_dataset(tmp_path), autodownload=False)
    sizes = count_data(args, data, 32).sizes
    grid = sum((imgsz // int(s)) ** 2 for s in STRIDES)
    topk, pairs = sizes.per_image(imgsz, STRIDES, 10), sizes.pairs_per_image(imgsz, STRIDES, grid)
    anywhere = dataclasses.replace(sizes, x=None, y=None, extent=None)  # each box at its worst place
    assert topk < anywhere.per_image(imgsz, STRIDES, 10) and pairs < anywhere.pairs_per_image(imgsz, STRIDES, grid)
    dataset = build_yolo_dataset(args, data["train"], 2, data, mode="train")
    assigner = TaskAlignedAssigner(topk=10, num_classes=1, stride=list(STRIDES))
    random.seed(0)
    np.random.seed(0)
    seen = []
    for i in [0, 1, 2] * 40:
        xywh = dataset[i]["bboxes"].double() * imgsz
        if not len(xywh):
            continue
        xyxy = torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1).float()[None]
        per_object = candidates(assigner, xyxy, torch.ones(1, len(xyxy[0]), 1), imgsz, STRIDES)[0].sum(1)
        seen.append((int(per_object.clamp(max=10).sum()), int(per_object.sum())))
    most = np.max(seen, 0)
    assert most[0] <= topk and most[1] <= pairs, (most, topk, pairs)
    assert most[0] > 0.3 * topk, (most, topk)  # the samples come near it: the bound is not vacuous


@pytest.mark.parametrize("layout", ["tiny", "identical", "edge", "mixed", "grid"])
def test_alignment_bound_never_under_any_shift(layout):
    """One image's boxes (no mosaic, at scale 1) shifted together by every offset on a 1/8 px grid within the anchor
    grid's period (and 60 random ones), clipped at the border: the real assigner's sum of min(topk, candidates) never
    exceeds the alignment bound, and comes near it. ``grid``: dense small squares, all under ``stride_val`` (16 px),
    one per 32 px cell at the same place in it: each is 16 px in the assigner, 2 x 2 + 1 + 1 anchors at its best
    shift, and the bound is exactly that (the hull half a pixel wider gave 3 per axis at strides 8 and 16: 10)."""
    from yolo_ckpt.memory.box_layout import most_per_sample
    from yolo_ckpt.memory.foreground import AUGMENT_KEYS, ObjectSizes, candidates

    imgsz, g = 128, np.random.default_rng(3)
    n = 16 if layout == "grid" else 40
    if layout == "grid":  # one square per 32 px cell, each at the same place in its cell
        w = h = g.uniform(2, 14, n)
        x, y = (np.arange(n) % 4) * 32 + 16.0, (np.arange(n) // 4) * 32 + 16.0
    else:
        w = {"tiny": g.uniform(1, 6, n), "identical": np.full(n, 21.0), "edge": g.uniform(8, 40, n), "mixed": g.uniform(1, 60, n)}[layout]
        h = w if layout == "identical" else g.uniform(1, 60, n) if layout == "mixed" else w * g.uniform(0.5, 1.5, n)
        x = np.full(n, 64.0) if layout == "identical" else g.uniform(0, 128, n)
        y = np.full(n, 64.0) if layout == "identical" else g.uniform(0, 128, n)
    if layout == "edge":
        x = np.where(g.random(n) < 0.5, g.uniform(-5, 5, n), g.uniform(123, 133, n))
    keys = tuple((k, 0.0) for k in (*AUGMENT_KEYS, "mosaic"))
    sizes = ObjectSizes(np.zeros(n, int), w / imgsz, h / imgsz, False, 1, keys, x / imgsz, y / imgsz, np.ones((1, 2)))
    bound = most_per_sample(sizes, imgsz, STRIDES, 10, (1.0, 1.0), mosaic=False)
    assigner = TaskAlignedAssigner(topk=10, num_classes=1, stride=list(STRIDES))
    grid = np.stack(np.meshgrid(np.arange(0, 32, 0.125), [0.0, 3.3, 17.05]), -1).reshape(-1, 2)
    shifts = np.concatenate([grid, g.uniform(0, 32, (60, 2))])
    most = 0
    for ox, oy in shifts:
        xyxy = torch.tensor(np.stack([x - w / 2 + ox, y - h / 2 + oy, x + w / 2 + ox, y + h / 2 + oy], 1), dtype=torch.float32)
        xyxy = torch.cat([xyxy[:, :2].clamp(0, imgsz), xyxy[:, 2:].clamp(0, imgsz)], 1)  # clipped, as augmentation does
        per_object = candidates(assigner, xyxy[None], torch.ones(1, n, 1), imgsz, STRIDES)[0].sum(1)
        most = max(most, int(per_object.clamp(max=10).sum()))
    assert most <= bound, (most, bound)
    assert most >= 0.7 * bound, (most, bound)  # and near it (boxes across the border: counted whole)
    if layout == "grid":
        assert most == bound == 6 * n, (most, bound)
