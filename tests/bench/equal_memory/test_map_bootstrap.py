"""Issue 33's noise study: the per-image matches it keeps give Ultralytics' own mAP back, and its paired bootstrap
cancels what two arms share."""

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import tiny_yaml, write_dataset
from ultralytics import YOLO

from benchmarks.equal_memory.map_bootstrap import PerImage, SegmentPerImage, bootstrap, mean_ap


def _labels_as_predictions(tmp_path, task: str, rows: list, alter, batch: int, **dataset) -> tuple[dict, object]:
    """Ultralytics' ``task`` validator with :class:`PerImage` (:class:`SegmentPerImage` for ``"segment"``) run on a val
    set of the label ``rows`` whose predictions are its labels, every other box moved by a pixel (true positives at
    some IoU thresholds only), with random confidences, each image's then changed by ``alter(prediction, truth, image
    index)``. Returns the kept images and the metrics."""
    g = torch.Generator().manual_seed(0)
    data = write_dataset(tmp_path / "data", {"train": rows, "val": rows}, **dataset)
    kept = {}

    class LabelsAsPredictions(SegmentPerImage if task == "segment" else PerImage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            kept["validator"] = self

        def update_metrics(self, preds, batch):
            preds = []
            for si in range(len(batch["img"])):
                truth = self._prepare_batch(si, batch)
                boxes = truth["bboxes"].clone()
                boxes[::2] += 1.0  # every other box moved 1 px right and down: IoU about 0.78
                conf = torch.rand(len(boxes), generator=g) * 0.5 + 0.5
                preds.append(alter({"bboxes": boxes, "conf": conf, "cls": truth["cls"]}, truth, self.seen + si))
            super().update_metrics(preds, batch)

    torch.manual_seed(0)
    metrics = YOLO(tiny_yaml(tmp_path, task)).val(
        validator=LabelsAsPredictions, data=data, imgsz=64, batch=batch, plots=False, verbose=False, workers=0
    )
    return kept["validator"].images, metrics


def _validated(tmp_path) -> tuple[dict, object]:
    """A val set of 8 images (2-3 boxes, 2 classes) whose predictions are its labels, every other box moved by a
    pixel and one image's boxes given the wrong class (false positives and missed labels)
    (:func:`_labels_as_predictions`). Returns its kept images and its metrics."""
    rows = [[f"{(i + k) % 2} {0.25 + 0.25 * k} 0.5 0.2 {0.3 + 0.1 * k}" for k in range(2 + i % 2)] for i in range(8)]

    def swap_classes_of_image_5(pred, truth, image):
        return {**pred, "cls": 1 - truth["cls"]} if image == 5 else pred

    return _labels_as_predictions(tmp_path, "detect", rows, swap_classes_of_image_5, 4, names=("a", "b"))


@pytest.mark.slow
def test_kept_images_give_ultralytics_map_and_a_paired_bootstrap(tmp_path):
    images, metrics = _validated(tmp_path)
    assert sorted(images) == [f"{i}.png" for i in range(8)]
    assert [len(images[f"{i}.png"]["target_cls"]) for i in range(8)] == [2 + i % 2 for i in range(8)]
    # the whole val set's mAP from the kept matches is Ultralytics' own, and not a trivial one
    full = mean_ap(list(images.values()))
    assert full == (metrics.box.map50, metrics.box.map) and 0.5 < full[1] < full[0] < 1.0
    names = sorted(images)
    # an arm paired with itself differs by nothing in every resample ("equal": the interval is 0 twice); its own
    # interval holds the whole set's figure
    boot = bootstrap({"a": images, "b": images}, names, "a", resamples=200, seed=0)
    assert boot["draws"].shape == (2, 2, 200) and np.array_equal(boot["draws"][0], boot["draws"][1])
    assert np.array_equal(boot["mAP"], [full, full]) and (boot["delta_interval"] == 0).all()
    low, high = boot["interval"][0, 1]
    assert low < full[1] < high
    # another arm that misses every box of image 0: paired, its mAP is never above, and the difference's interval lies
    # below 0 and is narrower than either arm's own (what the images share cancels)
    worse = {**images, "0.png": {**images["0.png"], **{k: images["0.png"][k][:0] for k in ("tp", "conf", "pred_cls")}}}
    boot = bootstrap({"a": images, "worse": worse}, names, "a", resamples=200, seed=0)
    assert (boot["draws"][1] <= boot["draws"][0] + 1e-12).all() and boot["delta"][1, 1] < 0
    low, high = boot["delta_interval"][1, 1]
    assert low < boot["delta"][1, 1] <= high <= 1e-12
    assert high - low < min(np.ptp(boot["interval"][a, 1]) for a in (0, 1))


@pytest.mark.slow
def test_segmentation_keeps_mask_and_box_matches(tmp_path):
    """A segmentation validator's kept images give Ultralytics' own mask and box mAP (:func:`mean_ap` of ``tp_m`` and
    of ``tp``): predictions are the labels, every other box moved by a pixel (its box matches at some IoU thresholds,
    its mask at all) and on two images every mask emptied (its boxes match, its masks never), so the two differ."""
    rows = [[f"0 {0.1 + 0.4 * k} 0.2 {0.4 + 0.4 * k} 0.2 {0.4 + 0.4 * k} 0.7 {0.1 + 0.4 * k} 0.7" for k in range(2)] for _ in range(6)]

    def with_masks(pred, truth, image):  # the labels' masks, emptied on images 1 and 4
        return {**pred, "masks": truth["masks"].clone().zero_() if image in (1, 4) else truth["masks"].clone()}

    kept, metrics = _labels_as_predictions(tmp_path, "segment", rows, with_masks, 3)
    images = list(kept.values())
    assert len(images) == 6 and all(im["tp_m"].shape == im["tp"].shape == (2, 10) for im in images)
    masks, boxes = mean_ap(images, "tp_m"), mean_ap(images)
    assert masks == pytest.approx((metrics.seg.map50, metrics.seg.map)) and boxes == pytest.approx((metrics.box.map50, metrics.box.map))
    assert masks != boxes and 0 < masks[1] < 1 and 0 < boxes[1] < 1


def test_baseline_names_one_arm_before_any_validation(tmp_path, monkeypatch):
    """baseline= is an arm's name or a recompute that one arm alone has; two arms of one name, or a recompute that
    several arms share, is refused with the valid choices before any arm is validated; over several results folders
    each arm is named by its folder."""
    import benchmarks.equal_memory.map_bootstrap as mb
    from yolo_ckpt.errors import ConfigError

    monkeypatch.setattr(mb, "validate", lambda *a: pytest.fail("validated before the baseline was checked"))
    arms = [("none", 352, ""), ("auto", 640, ""), ("none", 352, "{'size': 'fit', 'overlap': 32}"), ("none", 640, "")]
    rows = [
        {"cell": f"c{i}", "status": "ok", "recompute": r, "recompute_mode": "full", "imgsz_used": s, "tiles": t}
        for i, (r, s, t) in enumerate(arms + [("all", 640, "")])
    ]
    rows[-1]["recompute_mode"] = "selective"  # named apart from a full recomputation of the same layers
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    argv = [f"results={tmp_path}", "datasets=/nonexistent"]
    with pytest.raises(ConfigError, match=r"baseline=none names no one arm .*valid: \['all', 'all:selective @640', 'auto', "
                       r"'auto @640', 'none @352', 'none @352 tiles \(352 px, overlap 32\)', 'none @640'\]"):
        mb.main([*argv, "baseline=none"])
    pd.DataFrame(rows + [{**rows[0], "cell": "c4"}]).to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ConfigError, match=r"two ok rows are the same arm \(\['none @352'\]\)"):
        mb.main([*argv, "baseline=auto"])
    # two folders (arms of two schedules on one val set): each arm named by its folder, so the same arm in both is two
    for folder, part in (("a", rows[:3]), ("b", rows[2:3])):
        (tmp_path / folder).mkdir()
        pd.DataFrame(part).to_csv(tmp_path / folder / "results.csv", index=False)
    tiles = "none @352 tiles \\(352 px, overlap 32\\)"
    with pytest.raises(ConfigError, match=rf"baseline=none names no one arm of {tmp_path / 'a'}, {tmp_path / 'b'}; valid: "
                       rf"\['a: auto @640', 'a: none @352', 'a: {tiles}', 'auto', 'b: {tiles}'\]"):
        mb.main([f"results={tmp_path / 'a'},{tmp_path / 'b'}", "datasets=/nonexistent", "baseline=none"])
