"""The built-in synthetic datasets (yolo_ckpt.data.synthetic): read by Ultralytics' own dataset code in every task's
format, byte-identical for a seed, and cached where YOLO_CKPT_CACHE says."""

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
from ultralytics.data.dataset import ClassificationDataset, YOLODataset
from ultralytics.data.utils import check_cls_dataset, check_det_dataset
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt.data import aerial, cache, synthetic as syn

LABELLED = {"detect": "bboxes", "segment": "segments", "obb": "segments", "pose": "keypoints"}
# detect is generated for the fast subset anyway; every other task generates a dataset of its own (12-20 s here)
OTHER_TASKS = [pytest.param(t, marks=pytest.mark.slow) for t in syn.TASKS if t != "detect"]


@pytest.mark.parametrize("task", ["detect", *OTHER_TASKS])
def test_every_task_reads_in_ultralytics(task, synthetic):
    """Each task's dataset passes Ultralytics' dataset checks and label verification: every image, 15-40 vehicles
    each (the pose keypoints of shape (2, 3)), classify's 3 classes x 4 train scenes, semantic class ids of
    SEMANTIC_NAMES, depth in uint16 millimetres."""
    path = synthetic(task)
    if task == "classify":
        data = check_cls_dataset(path)
        assert data["nc"] == len(syn.CLASS_NAMES) and sorted(data["names"].values()) == sorted(syn.CLASS_NAMES)  # class folders, sorted
        dataset = ClassificationDataset(str(data["train"]), args=DEFAULT_CFG, augment=False)
        assert len(dataset) == len(syn.CLASS_NAMES) * syn.CLS_TRAIN_PER_CLASS
        return
    data = check_det_dataset(path)
    images = sorted(Path(data["train"]).glob("*.jpg"))
    assert len(images) == syn.TRAIN_IMAGES and cv2.imread(str(images[0])).shape == (aerial.IMAGE_SIZE, aerial.IMAGE_SIZE, 3)
    if task in LABELLED:
        labels = YOLODataset(img_path=data["train"], data=data, task=task, imgsz=64, augment=False).labels
        assert len(labels) == syn.TRAIN_IMAGES  # none dropped as corrupt
        for label in labels:
            n = len(label["cls"])
            assert 15 <= n <= 40 and set(np.unique(label["cls"])) <= set(range(len(syn.CLASS_NAMES)))
            assert len(label[LABELLED[task]]) == n and ((label["bboxes"] >= 0) & (label["bboxes"] <= 1)).all()
            if task == "pose":
                assert label["keypoints"].shape == (n, 2, 3) and data["kpt_shape"] == [2, 3]
        return
    folder, dtype = ("masks", np.uint8) if task == "semantic" else ("depth", np.uint16)
    target = cv2.imread(str(Path(data["path"]) / folder / "train" / f"{images[0].stem}.png"), cv2.IMREAD_UNCHANGED)
    assert target.shape == (aerial.IMAGE_SIZE, aerial.IMAGE_SIZE) and target.dtype == dtype
    if task == "semantic":
        assert set(np.unique(target)) <= set(range(len(syn.SEMANTIC_NAMES))) and data["masks_dir"] == "masks"
    else:
        assert data["depth_scale"] == syn.DEPTH_SCALE and target.min() > 0


def test_cached_in_yolo_ckpt_cache_and_reused(synthetic, synthetic_cache):
    """The dataset lives under $YOLO_CKPT_CACHE (the session's cache, set by conftest) in a folder named by version,
    seed and task; a second call returns it without writing anything (Ultralytics' label caches aside: the other xdist
    worker may be training on it)."""
    path = Path(synthetic("detect"))
    assert os.environ[cache.CACHE_ENV] == str(synthetic_cache)
    assert path.parent == synthetic_cache.resolve() / f"synthetic-v{cache.GENERATOR_VERSION}-seed0-detect"
    state = lambda: {p: p.stat().st_mtime_ns for p in path.parent.rglob("*") if p.is_file() and ".cache" not in p.name}  # noqa: E731
    before = state()
    assert syn.synthetic_dataset("detect") == path
    assert state() == before


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other(synthetic, tmp_path):
    """A fresh cache (root=) regenerates seed 0 byte for byte (data.yaml aside: it holds its folder); seed 1 draws
    other scenes."""
    ours = Path(synthetic("detect")).parent
    again = syn.synthetic_dataset("detect", root=tmp_path).parent
    files = sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file() and p.name != "data.yaml" and p.suffix != ".cache")
    assert len(files) == 2 * (syn.TRAIN_IMAGES + syn.VAL_IMAGES)  # images and labels
    assert all((ours / f).read_bytes() == (again / f).read_bytes() for f in files)
    other = syn.synthetic_dataset("detect", seed=1, root=tmp_path).parent
    assert (other / files[0]).read_bytes() != (ours / files[0]).read_bytes()


@pytest.mark.parametrize("task, seed, error", [("segmentation", 0, ValueError), ("detect", -1, ValueError), ("detect", 1.0, TypeError)])
def test_bad_task_or_seed_writes_nothing(task, seed, error, tmp_path):
    with pytest.raises(error, match="segmentation|seed"):
        syn.synthetic_dataset(task, seed=seed, root=tmp_path)
    assert list(tmp_path.iterdir()) == []
