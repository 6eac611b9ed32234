"""The training-set checks before the run folder is created (yolo_ckpt.train.data_check): each bad dataset one line, exit 2,
no run folder and no label cache written; a good one passes, and an existing cache is read, not rescanned."""

import shutil
from pathlib import Path

import pytest
import yaml
from helpers import logged_messages
from ultralytics.data.utils import check_det_dataset

from yolo_ckpt.cli import main
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.train.data_check import check_labels, scan_labels


def copy_dataset(synthetic, task, dest: Path) -> Path:
    """The synthetic dataset of ``task`` copied to ``dest`` (tests never change the session's), its data.yaml."""
    src = Path(synthetic(task)).parent
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.cache"))
    data = yaml.safe_load((dest / "data.yaml").read_text())
    data["path"] = str(dest)
    (dest / "data.yaml").write_text(yaml.safe_dump(data))
    return dest / "data.yaml"


def set_first_row(labels: Path, row: str) -> None:
    """Replace the first row of the first training label file."""
    first = sorted(labels.glob("*.txt"))[0]
    lines = first.read_text().splitlines()
    first.write_text("\n".join([row, *lines[1:]]) + "\n")


def add_kpt_shape(data: Path) -> None:
    """A pose data.yaml (2 keypoints of x, y, visible) over the detect labels: boxes only, the wrong kind for pose."""
    data.write_text(yaml.safe_dump({**yaml.safe_load(data.read_text()), "kpt_shape": [2, 3], "flip_idx": [0, 1]}))


def corrupt_all_images(images: Path) -> None:
    for p in images.glob("*.jpg"):
        p.write_bytes(b"not a jpeg")


BAD = {
    "no labels": (
        "detect",
        lambda d: [p.unlink() for p in (d / "labels" / "train").glob("*.txt")],
        "no labels at all for the 8 training images",
    ),
    "empty labels": ("detect", lambda d: [p.write_text("") for p in (d / "labels" / "train").glob("*.txt")], "no labels at all"),
    "boxes for segment": ("segment", None, "labels are boxes only (class x y w h); task=segment needs polygons"),
    "boxes for pose": ("pose", lambda d: add_kpt_shape(d / "data.yaml"), "labels require 11 columns each (8 of 8 label files rejected"),
    "no kpt_shape for pose": ("pose", None, "task=pose needs kpt_shape: [keypoints, 2 or 3]"),
    "class id >= nc": (
        "detect",
        lambda d: set_first_row(d / "labels" / "train", "7 0.5 0.5 0.1 0.1"),
        "Label class 7 exceeds dataset class count 3",
    ),
    "negative class id": ("detect", lambda d: set_first_row(d / "labels" / "train", "-1 0.5 0.5 0.1 0.1"), "negative label values"),
    "NaN coordinate": ("detect", lambda d: set_first_row(d / "labels" / "train", "0 nan 0.5 0.1 0.1"), "train_000.txt: "),
    "out of range": (
        "detect",
        lambda d: set_first_row(d / "labels" / "train", "0 1.5 0.5 0.1 0.1"),
        "non-normalized or out of bounds coordinates",
    ),
    "no train images": ("detect", lambda d: shutil.rmtree(d / "images" / "train"), "images/train does not exist"),
    "all images corrupt": ("detect", lambda d: corrupt_all_images(d / "images" / "train"), "all 8 training images are corrupt"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_dataset_exits_2_before_the_run_folder(case, synthetic, tmp_path, capsys):
    """Each bad training set of the closed list: one line naming the problem, exit 2, no run folder, no cache."""
    task, spoil, message = BAD[case]
    data = copy_dataset(synthetic, "detect", tmp_path / "data")  # detect labels: the wrong kind for segment
    if spoil:
        spoil(data.parent)
    runs = tmp_path / "runs"
    assert main(["train", task, f"data={data}", "epochs=1", "imgsz=64", "batch=2", "device=cpu", f"project={runs}", "name=run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("yolo-ckpt: error: ") and message in err[-1], err[-1]
    if case in {"class id >= nc", "negative class id", "NaN coordinate", "out of range"}:
        assert "1 of 8 label files rejected" in err[-1] and "Stock Ultralytics drops these images" in err[-1]
    assert not runs.exists() and not list(data.parent.rglob("*.cache"))


def test_background_share_is_a_warning_and_a_good_dataset_passes(synthetic, tmp_path):
    """Labels for 3 of 8 images (5 backgrounds > 50%): a warning, no error; all labelled: silent; nothing written."""
    data = copy_dataset(synthetic, "detect", tmp_path / "data")
    names = yaml.safe_load(data.read_text())
    checked = {**names, "train": str(data.parent / "images" / "train"), "yaml_file": str(data)}
    with logged_messages() as quiet:
        check_labels(checked, "detect")
    assert not [m for m in quiet if "background" in m]
    for p in sorted((data.parent / "labels" / "train").glob("*.txt"))[:5]:
        p.unlink()
    with logged_messages() as messages:
        check_labels(checked, "detect")
    assert [m for m in messages if "5 of 8 training images have no labels (background images)" in m]
    assert not list(data.parent.rglob("*.cache"))


def test_an_existing_label_cache_is_read_not_rescanned(synthetic, tmp_path, monkeypatch):
    """With the label cache the trainer wrote (Ultralytics' own YOLODataset scan), the check verifies no image
    again: verify_image_label is never called, and the cache is left as it was."""
    from ultralytics.data import dataset as yolo_dataset

    data = copy_dataset(synthetic, "detect", tmp_path / "data")
    checked = check_det_dataset(str(data))
    yolo_dataset.YOLODataset(img_path=checked["train"], data=checked, task="detect", augment=False, imgsz=64)
    cache = data.parent / "labels" / "train.cache"
    before = cache.read_bytes()
    calls = []
    monkeypatch.setattr(yolo_dataset, "verify_image_label", lambda *a: calls.append(a))
    check_labels(checked, "detect")
    set_first_row(data.parent / "labels" / "train", "9 0.5 0.5 0.1 0.125")  # the file's size changes: the cache is stale
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="Label class 9 exceeds dataset class count 3"):
        check_labels(checked, "detect")
    assert calls == [] and cache.read_bytes() == before


def test_the_scan_writes_no_cache_and_puts_ultralytics_back(synthetic, tmp_path, monkeypatch):
    """Issue 32 (no unittest.mock in the package): inside the scan Ultralytics' save_dataset_cache_file writes
    nothing, and the module's own function is back afterwards, also when the scan raises."""
    from ultralytics.data import dataset as yolo_dataset

    data = copy_dataset(synthetic, "detect", tmp_path / "data")
    checked = {**yaml.safe_load(data.read_text()), "train": str(data.parent / "images" / "train"), "yaml_file": str(data)}
    stock = yolo_dataset.save_dataset_cache_file
    written = []

    def scan(self, cache_path, cache_hash):
        written.append(yolo_dataset.save_dataset_cache_file("", cache_path, {}, "1.0.3"))  # cache_labels' own call
        raise RuntimeError("the scan failed")

    monkeypatch.setattr(yolo_dataset.YOLODataset, "_load_or_scan_cache", scan)
    with pytest.raises(RuntimeError, match="the scan failed"):
        scan_labels(checked, "detect")
    assert written == [None] and yolo_dataset.save_dataset_cache_file is stock
    assert not list(data.parent.rglob("*.cache"))
    monkeypatch.undo()
    cache, cache_path = scan_labels(checked, "detect")
    assert cache["results"][0] == 8 and not cache_path.exists() and yolo_dataset.save_dataset_cache_file is stock


def test_a_corrupt_image_among_good_ones_is_one_warning_with_the_real_reason(synthetic, tmp_path):
    """One training image that is no image (bytes PIL cannot identify) among 7 good ones: stock leaves it out of training
    saying "No module named 'pi_heif'" (its Image.open patch tries a HEIF plugin on any unreadable file); the check
    leaves it out too, with one warning line naming the file and the real reason, and writes nothing."""
    data = copy_dataset(synthetic, "detect", tmp_path / "data")
    bad = sorted((data.parent / "images" / "train").glob("*.jpg"))[3]
    bad.write_bytes(b"not an image" * 20)
    checked = check_det_dataset(str(data))
    stock = scan_labels(checked, "detect")[0]["msgs"]
    assert [m for m in stock if "ignoring corrupt image" in m] == [f"{bad}: ignoring corrupt image/label: No module named 'pi_heif'"]
    with logged_messages() as messages:
        check_labels(checked, "detect")
    assert [m for m in messages if m.startswith("WARNING")] == [
        f"WARNING ⚠️ {bad}: not a readable image (cannot identify image file '{bad}'); 1 of 8 training images cannot be read and "
        "are left out of training, as stock Ultralytics leaves them out"
    ]
    assert not list(data.parent.rglob("*.cache"))
