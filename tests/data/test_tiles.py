"""The small-object generator (deterministic, objects of the stated size) and the tiler (labels clipped and kept,
tile count, the source untouched), at tiny sizes: issue 14; polygon labels clipped exactly: issue 46."""

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from ultralytics.data.utils import verify_image_label

from yolo_ckpt.data.small_objects import SMALL_OBJECT_PX, small_object_dataset
from yolo_ckpt.data.tiles import MIN_VISIBLE, clip_polygon, polygon_area, tile_dataset, tile_starts


def _tree_digest(folder: Path) -> dict:
    """Relative path -> SHA-256 of every file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_small_objects_deterministic_and_sized(tmp_path):
    a = small_object_dataset(128, 2, 1, root=tmp_path / "a")
    b = small_object_dataset(128, 2, 1, root=tmp_path / "b")
    other = small_object_dataset(128, 2, 1, seed=1, root=tmp_path / "a")
    digest = _tree_digest(a.parent)
    assert len(digest) == 7  # 3 images, 3 labels, data.yaml (whose path: differs)
    assert {k: v for k, v in digest.items() if k != "data.yaml"} == {k: v for k, v in _tree_digest(b.parent).items() if k != "data.yaml"}
    assert _tree_digest(other.parent)["images/train/000.jpg"] != digest["images/train/000.jpg"]
    image = cv2.imread(str(a.parent / "images/train/000.jpg"))
    assert image.shape == (128, 128, 3)
    rows = np.loadtxt(a.parent / "labels/train/000.txt", ndmin=2)
    assert 3 <= len(rows) <= 9 and set(rows[:, 0]) == {0}  # 20-60 crosses per 320 x 320 px
    np.testing.assert_allclose(rows[:, 3:] * 128, SMALL_OBJECT_PX, atol=1e-4)  # every box SMALL_OBJECT_PX square
    x, y = np.round(rows[0, 1:3] * 128 - SMALL_OBJECT_PX / 2).astype(int)
    patch = image[y : y + SMALL_OBJECT_PX, x : x + SMALL_OBJECT_PX].astype(int).sum(2)
    mid = SMALL_OBJECT_PX // 2
    assert patch[mid, mid] > patch[0, 0] + 150  # a cross: lit centre, dark corner
    with pytest.raises(ValueError, match="size=32 must be an int >= 64"):
        small_object_dataset(32, root=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_tile_starts():
    assert tile_starts(640, 352, 64) == [0, 288]
    assert tile_starts(100, 352, 64) == [0]
    starts = tile_starts(1000, 300, 50)
    assert starts[0] == 0 and starts[-1] == 700 and all(300 - (b - a) >= 50 for a, b in zip(starts, starts[1:]))


def _source(tmp_path) -> Path:
    """A 2-image detection dataset of 100 x 60 px with boxes at known places."""
    root = tmp_path / "src"
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        cv2.imwrite(str(root / "images" / split / "a.png"), np.full((60, 100, 3), 90, np.uint8))
    # box 0: [10, 10, 20, 20] wholly in the left tile; box 1: [44, 20, 56, 30] straddling the tiles' overlap;
    # box 2: [60, 40, 90, 50] 30 px wide, 8 of them inside the left tile (kept only in the right one).
    boxes = [(0, 15, 15, 10, 10), (1, 50, 25, 12, 10), (0, 75, 45, 30, 10)]
    text = "".join(f"{c} {x / 100} {y / 60} {w / 100} {h / 60}\n" for c, x, y, w, h in boxes)
    for split in ("train", "val"):
        (root / "labels" / split / "a.txt").write_text(text)
    (root / "data.yaml").write_text("train: images/train\nval: images/val\nnames: {0: a, 1: b}\n")
    return root / "data.yaml"


def test_tiles_clip_and_keep_labels_and_leave_the_source(tmp_path):
    data = _source(tmp_path)
    before = _tree_digest(data.parent)
    out = tile_dataset(data, tmp_path / "tiles", size=64, overlap=24)  # x starts 0, 36 (28 px overlap); one row
    assert _tree_digest(data.parent) == before
    for split in ("train", "val"):
        assert sorted(p.name for p in (out.parent / "images" / split).iterdir()) == ["a_0_0.png", "a_36_0.png"]
    assert cv2.imread(str(out.parent / "images/train/a_36_0.png")).shape == (60, 64, 3)
    left = np.loadtxt(out.parent / "labels/train/a_0_0.txt", ndmin=2) * [1, 64, 60, 64, 60]
    right = np.loadtxt(out.parent / "labels/train/a_36_0.txt", ndmin=2) * [1, 64, 60, 64, 60]
    np.testing.assert_allclose(left, [[0, 15, 15, 10, 10], [1, 50, 25, 12, 10]], atol=1e-3)
    # right tile spans x 36..100: box 1 whole at 14..26, box 2 whole at 24..54; box 0 is outside
    np.testing.assert_allclose(right, [[1, 14, 25, 12, 10], [0, 39, 45, 30, 10]], atol=1e-3)
    assert 4 / 30 < MIN_VISIBLE  # box 2 has 4 of its 30 px in the left tile: dropped there
    assert "names" in out.read_text() and str(out.parent) in out.read_text()


def test_tiles_clip_a_box_cut_by_the_tile_edge(tmp_path):
    data = _source(tmp_path)
    out = tile_dataset(data, tmp_path / "tiles", size=48, overlap=0)  # x starts 0, 26, 52; y starts 0, 12
    assert len(list((out.parent / "images/train").iterdir())) == 6
    labels = lambda name: np.loadtxt(out.parent / "labels/train" / name, ndmin=2) * [1, 48, 48, 48, 48]  # noqa: E731
    # box 2 [60, 90] x [40, 50]: 8 of its 10 rows lie in the tile x 52..100, y 0..48: kept, clipped to y 40..48
    np.testing.assert_allclose(labels("a_52_0.txt"), [[0, 23, 44, 30, 8]], atol=1e-3)
    # box 1 [44, 56] x [20, 30]: 4 of 12 columns in x 0..48 (dropped), whole in x 26..74
    np.testing.assert_allclose(labels("a_0_0.txt"), [[0, 15, 15, 10, 10]], atol=1e-3)
    np.testing.assert_allclose(labels("a_26_0.txt"), [[1, 24, 25, 12, 10]], atol=1e-3)


def test_tiles_bad_input_writes_nothing(tmp_path):
    data = _source(tmp_path)
    with pytest.raises(ValueError, match="overlap=40 must be an int in"):
        tile_dataset(data, tmp_path / "t", size=64, overlap=40)
    with pytest.raises(ValueError, match="new folder outside the source"):
        tile_dataset(data, data.parent / "t", size=64, overlap=8)
    assert not (tmp_path / "t").exists() and not (data.parent / "t").exists()


def _segment_source(tmp_path, w: int, h: int, polygons: list) -> Path:
    """A 1-image segmentation dataset (train = val) of ``w`` x ``h`` px with the pixel ``polygons`` (class 0)."""
    root = tmp_path / "seg"
    text = "".join("0 " + " ".join(f"{x / w} {y / h}" for x, y in p) + "\n" for p in polygons)
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        cv2.imwrite(str(root / "images" / split / "a.png"), np.full((h, w, 3), 90, np.uint8))
        (root / "labels" / split / "a.txt").write_text(text)
    (root / "data.yaml").write_text("train: images/train\nval: images/val\nnames: {0: nucleus}\n")
    return root / "data.yaml"


def _polygons(label: Path, w: int, h: int) -> list:
    """The polygons of a segment label file, in pixels of a ``w`` x ``h`` tile."""
    return [np.array(line.split()[1:], float).reshape(-1, 2) * [w, h] for line in label.read_text().splitlines()]


def test_clip_polygon_exact():
    # a U cut below its arms: two pieces joined along the bound, their area exact
    u = [(0, 0), (30, 0), (30, 30), (20, 30), (20, 10), (10, 10), (10, 30), (0, 30)]
    cut = clip_polygon(u, -1, 20, 31, 40)
    np.testing.assert_array_equal(cut, [(0, 20), (30, 20), (30, 30), (20, 30), (20, 20), (10, 20), (10, 30), (0, 30)])
    assert polygon_area(u) == 700 and polygon_area(cut) == 200
    assert len(clip_polygon(u, 40, 40, 50, 50)) == 0 and polygon_area(u[:2]) == 0


def test_tiles_clip_polygons_at_edges_and_corners(tmp_path):
    # 128 x 128 px in four 64 px tiles (no overlap): a triangle inside the tile at (0, 64); an inverted L (concave,
    # 800 px^2) across x = 64, its bar 440 px^2 left of it (kept there: 55%) and its leg right of it (45%: dropped); a
    # diamond (288 px^2) across the corner (64, 64), 216 px^2 in the tile at (0, 0) (kept) and 36 in two others
    inner = [(10, 80), (30, 80), (20, 100)]
    ell = [(20, 10), (76, 10), (76, 50), (68, 50), (68, 20), (20, 20)]
    diamond = [(58, 46), (70, 58), (58, 70), (46, 58)]
    out = tile_dataset(_segment_source(tmp_path, 128, 128, [inner, ell, diamond]), tmp_path / "tiles", size=64, overlap=0, task="segment")
    labels = out.parent / "labels" / "train"
    assert sorted(p.name for p in labels.iterdir()) == ["a_0_0.txt", "a_0_64.txt", "a_64_0.txt", "a_64_64.txt"]
    top_left = _polygons(labels / "a_0_0.txt", 64, 64)
    np.testing.assert_allclose(top_left[0], [(20, 10), (64, 10), (64, 20), (20, 20)], atol=1e-4)  # the L's bar, its leg cut
    np.testing.assert_allclose(top_left[1], [(58, 46), (64, 52), (64, 64), (52, 64), (46, 58)], atol=1e-4)  # the corner cut
    np.testing.assert_allclose(_polygons(labels / "a_0_64.txt", 64, 64)[0], [(10, 16), (30, 16), (20, 36)], atol=1e-4)  # shifted
    assert (labels / "a_64_0.txt").read_text() == (labels / "a_64_64.txt").read_text() == ""
    # Ultralytics reads them as segments and derives each box from the clipped polygon: the bar's, not the L's clipped
    image = str(out.parent / "images/train/a_0_0.png")
    _, boxes, shape, segments, *_ = verify_image_label((image, str(labels / "a_0_0.txt"), "", False, 1, 0, 0, False))
    assert shape == (64, 64) and len(segments) == 2
    np.testing.assert_allclose(boxes * [1, 64, 64, 64, 64], [[0, 42, 15, 44, 10], [0, 55, 55, 18, 18]], atol=1e-3)


def test_tiles_polygon_leaving_a_tile_through_the_overlap(tmp_path):
    # 100 x 60 px in tiles x 0..64 and 36..100 (28 px overlap): a pentagon (960 px^2) over x 30..58 is whole in the
    # left tile and leaves the right one through its left edge at x = 36 (720 px^2 inside: kept, clipped); a triangle
    # (340 px^2) over x 56..90 is whole in the right tile and has 141 px^2 (41%) in the left one: dropped there
    pentagon = [(30, 10), (50, 10), (58, 30), (50, 50), (30, 50)]
    triangle = [(56, 20), (90, 20), (56, 40)]
    out = tile_dataset(_segment_source(tmp_path, 100, 60, [pentagon, triangle]), tmp_path / "tiles", size=64, overlap=24, task="segment")
    for split in ("train", "val"):
        left, right = (_polygons(out.parent / "labels" / split / f"a_{x}_0.txt", 64, 60) for x in (0, 36))
        assert len(left) == 1 and len(right) == 2
        np.testing.assert_allclose(left[0], pentagon, atol=1e-4)
        np.testing.assert_allclose(right[0], [(0, 10), (14, 10), (22, 30), (14, 50), (0, 50)], atol=1e-4)
        np.testing.assert_allclose(right[1], [(20, 20), (54, 20), (20, 40)], atol=1e-4)
    assert 141.2 / 340 < MIN_VISIBLE <= 720 / 960


def test_tiles_refuse_labels_of_another_format(tmp_path):
    seg = _segment_source(tmp_path, 100, 60, [[(30, 10), (50, 10), (40, 30)]])
    with pytest.raises(ValueError, match="takes detection labels 'cls xc yc w h' for task=detect; got a line of 7 fields"):
        tile_dataset(seg, tmp_path / "t", size=64, overlap=8)
    with pytest.raises(ValueError, match="takes segment labels .* for task=segment; got a line of 5 fields"):
        tile_dataset(_source(tmp_path), tmp_path / "t", size=64, overlap=8, task="segment")
    with pytest.raises(ValueError, match="task='pose' cannot be tiled; valid: detect, segment"):
        tile_dataset(seg, tmp_path / "t", size=64, overlap=8, task="pose")
    assert not (tmp_path / "t").exists()
