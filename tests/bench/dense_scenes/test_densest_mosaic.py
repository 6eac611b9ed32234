"""The densest-mosaic benchmark's choice of images: by objects, or by the foreground their boxes can give (a few
large objects claim more anchors than many tiny ones); and its sparser batches (each image's first objects)."""

import numpy as np
import torch
from helpers import write_dataset
from ultralytics.utils.tal import TaskAlignedAssigner

from benchmarks.dense_scenes.densest_mosaic import densest_mosaic
from benchmarks.dense_scenes.foreground_sampled import sample_counts


def test_rank_by_foreground_picks_the_image_of_large_objects(tmp_path):
    # image 0: three 4 px boxes (the assigner floors them at 16 px: a few anchors each); image 1: two boxes of most of
    # the image (about 60 anchors each, 30 with topk=30)
    boxes = [[(0.2 + 0.3 * k, 0.2, 0.06, 0.06) for k in range(3)], [(0.5, 0.5, 0.9, 0.9), (0.5, 0.5, 0.8, 0.9)]]
    rows = [[f"0 {x} {y} {w} {h}" for x, y, w, h in image] for image in boxes]
    grey = [np.full((64, 64, 3), 100 + 50 * i, np.uint8) for i in range(2)]
    data = write_dataset(tmp_path, {"train": rows, "val": rows}, {"train": grey, "val": grey})
    assigner, strides = TaskAlignedAssigner(topk=30, num_classes=1), [8.0, 16.0, 32.0]
    rank = lambda item: sample_counts(assigner, item["bboxes"], 64, strides)[1]  # noqa: E731
    by_objects, objects = densest_mosaic(data, 128, task="detect", repeat=True)
    by_foreground, foreground = densest_mosaic(data, 128, task="detect", repeat=True, rank=rank)
    assert objects == [3] * 4 and foreground == [2] * 4
    assert len(by_foreground["bboxes"]) == 8 and abs(float(by_foreground["bboxes"][:, 2:].max()) - 0.45) < 1e-6  # in its quarter
    in_box = [sample_counts(assigner, b["bboxes"], 128, strides) for b in (by_objects, by_foreground)]
    assert in_box[1][1] > in_box[0][1]  # the foreground the chosen mosaic can give


def test_objects_keeps_each_images_first_objects_with_their_masks(tmp_path):
    """``objects=2`` of three rectangles: two per quarter, and the overlap mask's index j + 1 is still object j's."""
    rects = [(0.05, 0.05, 0.45, 0.3), (0.55, 0.1, 0.95, 0.6), (0.1, 0.5, 0.4, 0.95)]  # x1, y1, x2, y2: apart
    rows = [[f"0 {a} {b} {c} {b} {c} {d} {a} {d}" for a, b, c, d in rects]]
    data = write_dataset(tmp_path, {"train": rows, "val": rows})
    batch, counts = densest_mosaic(data, 128, task="segment", repeat=True, objects=2)
    assert counts == [2] * 4 and len(batch["bboxes"]) == 8
    masks = batch["masks"][0]
    assert sorted(masks.unique().tolist()) == list(range(9))
    for j, (x, y, w, h) in enumerate(batch["bboxes"].tolist()):
        ys, xs = torch.nonzero(masks == j + 1, as_tuple=True)
        cx, cy = (xs.float().mean() + 0.5) / masks.shape[1], (ys.float().mean() + 0.5) / masks.shape[0]
        assert abs(cx - x) < w / 4 and abs(cy - y) < h / 4, j  # the mask of object j lies on its box
