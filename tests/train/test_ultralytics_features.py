"""Ultralytics' own feature tests, run through the checkpointed trainers with the set-up estimate on: a model of 1 input
channel for every task Ultralytics trains in grayscale (its ``test_grayscale``: detect, segment, pose, obb, semantic),
of 10 (its ``test_multichannel``, a multispectral set of 10-page TIFFs) and ``rect=True`` (its ``test_feature``'s
rect case). Each trains as stock does, bit for bit, and its estimate is made (issue 43: the estimate built a 3-channel
input, and read a label key that rect datasets drop). An estimate that still fails is a report, not a gate."""

from pathlib import Path

import cv2
import pytest
import yaml
from helpers import assert_state_equal, logged_messages, train

from yolo_ckpt import trainer_for
from yolo_ckpt.report.record import load_report
from yolo_ckpt.train.log import PREFIX

pytestmark = pytest.mark.usefixtures("one_thread")


def with_channels(data: str, channels: int, folder: Path) -> str:
    """``data`` (a data.yaml) with ``channels: <channels>``, written in ``folder``, as Ultralytics' ``test_grayscale``
    writes its grayscale copy: the same images, read as that many channels."""
    spec = yaml.safe_load(Path(data).read_text())
    spec = {**spec, "path": str(Path(data).parent / spec.get("path", ".")), "channels": channels}
    out = folder / f"{Path(data).stem}-{channels}ch.yaml"
    out.write_text(yaml.safe_dump(spec))
    return str(out)


def multispectral(data: str, folder: Path, bands: int = 10) -> str:
    """The detect dataset ``data`` as ``bands``-band images of 256 px (multi-page TIFFs, one grey page per band:
    Ultralytics stacks the pages as channels, as its coco8-multispectral), the labels copied, ``channels: <bands>``."""
    spec = yaml.safe_load(Path(data).read_text())
    root = Path(data).parent / spec.get("path", ".")
    for split in ("train", "val"):
        (folder / "images" / split).mkdir(parents=True)
        (folder / "labels" / split).mkdir(parents=True)
        for image in sorted((root / spec[split]).iterdir()):
            bgr = cv2.resize(cv2.imread(str(image)), (256, 256), interpolation=cv2.INTER_AREA)  # 10 pages of 1600 px: slow to read
            pages = [bgr[..., i % 3] // (1 + i // 3) for i in range(bands)]  # the colour planes, dimmed by band
            assert cv2.imwritemulti(str(folder / "images" / split / f"{image.stem}.tiff"), pages)
            label = root / "labels" / split / f"{image.stem}.txt"
            (folder / "labels" / split / label.name).write_bytes(label.read_bytes())
    out = folder / "data.yaml"
    spec = {"path": str(folder), "train": "images/train", "val": "images/val", "names": spec["names"], "channels": bands}
    out.write_text(yaml.safe_dump(spec))
    return str(out)


def trains_as_stock(model: str, task: str, data: str, tmp_path, **kw):
    """recompute=all with the set-up estimate against stock on ``data``: bit-identical weights, BN buffers and EMA, every
    layer recomputed, the estimate made (its peaks in the run report). Returns the checkpointed trainer."""
    stock, _ = train(model, data, tmp_path, "stock", fraction=0.5, **kw)
    ckpt, counter = train(model, data, tmp_path, "ckpt", trainer=trainer_for(task), recompute="all", estimate=True, fraction=0.5, **kw)
    steps = ckpt.ema.updates
    assert steps >= 2 and stock.ema.updates == steps
    assert dict(counter.per_layer) == dict.fromkeys(ckpt.policy.indices, steps + 1)  # + the report's memory probe
    assert_state_equal(stock.model, ckpt.model)
    assert_state_equal(stock.ema.ema, ckpt.ema.ema)
    report = load_report(ckpt.save_dir)
    assert report.estimate_skipped is None and 0 < report.estimated_all_peak_bytes <= report.estimated_none_peak_bytes
    return ckpt


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, model",
    [("detect", "yolo11n.yaml"), ("segment", "yolo11n-seg.yaml"), ("pose", "yolo11n-pose.yaml"), ("obb", "yolo11n-obb.yaml"),
     ("semantic", "yolo26n-sem.yaml")],
)
def test_grayscale(task, model, synthetic, tmp_path):
    """Ultralytics' ``test_grayscale``: the task's dataset read as 1-channel images (``channels: 1``); the model is
    built with one input channel and the estimate's fake passes and loss calibration feed it one."""
    ckpt = trains_as_stock(model, task, with_channels(synthetic(task), 1, tmp_path), tmp_path)
    assert ckpt.model.model[0].conv.in_channels == 1 and ckpt.model.yaml["channels"] == 1


@pytest.mark.slow
def test_multichannel(synthetic, tmp_path):
    """Ultralytics' ``test_multichannel``: 10-band images (``channels: 10``)."""
    ckpt = trains_as_stock("yolo11n.yaml", "detect", multispectral(synthetic("detect"), tmp_path / "multispectral"), tmp_path)
    assert ckpt.model.model[0].conv.in_channels == 10


@pytest.mark.slow
def test_rect(synthetic, tmp_path):
    """Ultralytics' ``test_feature[rect]``: rectangular batches (no mosaic, which rect turns off: the estimate plans the
    data's own objects per image, not four images' worth)."""
    ckpt = trains_as_stock("yolo11n.yaml", "detect", synthetic("detect"), tmp_path, rect=True)
    counts = ckpt.ckpt_state.planned.counts
    assert counts.augment == () and counts.planned_objects == counts.max_objects >= 1


@pytest.mark.slow
def test_a_failing_estimate_is_a_report_not_a_gate(synthetic, tmp_path, monkeypatch):
    """An estimate that fails at set-up (the data's box sizes raise, as rect datasets' missing 'shape' key did): one
    warning line naming the failure, and the run trains on, bit-equal to stock, the report saying why it has no
    estimate. Where the run needs the estimate (recompute=auto, batch=-1 with a budget): one line, a PlanError, raised
    before the first epoch, the run folder not left behind."""
    from yolo_ckpt.memory import runspec
    from yolo_ckpt.memory.memory_model import PlanError

    def fails(*args, **kwargs):
        raise KeyError("shape")

    monkeypatch.setattr(runspec, "object_sizes", fails)
    data = synthetic("detect")
    stock, _ = train("yolo11n.yaml", data, tmp_path, "stock", fraction=0.5)
    with logged_messages() as messages:
        ckpt, counter = train(
            "yolo11n.yaml", data, tmp_path, "ckpt", trainer=trainer_for("detect"), recompute="all", estimate=True, fraction=0.5
        )
    warnings = [m for m in messages if m.startswith("WARNING") and "estimate" in m]
    assert warnings == [f"WARNING ⚠️ {PREFIX}the estimate failed: KeyError: 'shape'; training goes on without it"]
    assert counter.total > 0
    assert_state_equal(stock.model, ckpt.model)
    report = load_report(ckpt.save_dir)
    assert report.estimate_skipped == "the estimate failed: KeyError: 'shape'" and report.estimated_none_peak_bytes is None
    for keys in ({"recompute": "auto", "memory_budget": "1GB"}, {"batch": -1, "memory_budget": "1GB"}):
        with pytest.raises(PlanError) as raised:
            train("yolo11n.yaml", data, tmp_path / "needs", "run", trainer=trainer_for("detect"), estimate=True, **{"batch": 2, **keys})
        what = "recompute=auto" if "recompute" in keys else "batch=-1"
        assert str(raised.value) == (
            f"{what} needs the memory estimate, which failed for this run (KeyError: 'shape'); give a named recompute= "
            "(e.g. recompute=all) and a batch= to train without it"
        )
        assert not (tmp_path / "needs" / "run").exists()

