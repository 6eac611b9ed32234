"""The densest-mosaic benchmark's choice of images: by objects, or by the foreground their boxes can give (a few
large objects claim more anchors than many tiny ones)."""

import cv2
import numpy as np
import yaml
from ultralytics.utils.tal import TaskAlignedAssigner

from benchmarks.densest_mosaic import densest_mosaic
from benchmarks.foreground_sampled import sample_counts


def test_rank_by_foreground_picks_the_image_of_large_objects(tmp_path):
    # image 0: three 4 px boxes (the assigner floors them at 16 px: a few anchors each); image 1: two boxes of most of
    # the image (about 60 anchors each, 30 with topk=30)
    labels = {0: [(0.2 + 0.3 * k, 0.2, 0.06, 0.06) for k in range(3)], 1: [(0.5, 0.5, 0.9, 0.9), (0.5, 0.5, 0.8, 0.9)]}
    for split in ("train", "val"):
        (tmp_path / "images" / split).mkdir(parents=True)
        (tmp_path / "labels" / split).mkdir(parents=True)
        for i, boxes in labels.items():
            cv2.imwrite(str(tmp_path / "images" / split / f"{i}.png"), np.full((64, 64, 3), 100 + 50 * i, np.uint8))
            (tmp_path / "labels" / split / f"{i}.txt").write_text("".join(f"0 {x} {y} {w} {h}\n" for x, y, w, h in boxes))
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "images/train", "val": "images/val", "names": {0: "a"}}))
    assigner, strides = TaskAlignedAssigner(topk=30, num_classes=1), [8.0, 16.0, 32.0]
    rank = lambda item: sample_counts(assigner, item["bboxes"], 64, strides)[1]  # noqa: E731
    by_objects, objects = densest_mosaic(str(data), 128, task="detect", repeat=True)
    by_foreground, foreground = densest_mosaic(str(data), 128, task="detect", repeat=True, rank=rank)
    assert objects == [3] * 4 and foreground == [2] * 4
    assert len(by_foreground["bboxes"]) == 8 and abs(float(by_foreground["bboxes"][:, 2:].max()) - 0.45) < 1e-6  # in its quarter
    in_box = [sample_counts(assigner, b["bboxes"], 128, strides) for b in (by_objects, by_foreground)]
    assert in_box[1][1] > in_box[0][1]  # the foreground the chosen mosaic can give
