"""``yolo-ckpt bench``: step and train matrices at tiny settings, baseline deltas, rerun skipping, failed cells,
and the checks a matrix file gets before anything runs."""

import copy
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from helpers import large_box_dataset, logged_messages, tiny_yaml

from yolo_ckpt.bench import matrix, matrix_file as bench, step_cell, train_cell
from yolo_ckpt.bench.cells import BUILT_IN_DATASETS
from yolo_ckpt.bench.results_io import LEG, git_state
from yolo_ckpt.cli import main
from yolo_ckpt.shipped import shipped

ROOT = Path(__file__).resolve().parents[2]


def write_matrix(folder: Path, spec: dict, name: str = "m.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(spec))
    return path


STEP = {
    "kind": "step",
    "settings": {"objects": 2, "pairs": 1},
    "grid": [{"model": "yolo11n.yaml", "imgsz": 128, "batch": 1, "recompute": ["none", "all"]}],
}


@pytest.mark.slow
def test_step_matrix(tmp_path, monkeypatch, one_thread):
    out = tmp_path / "out"
    rows, real_measure = [], step_cell.measure  # the measured rows, kept for the rerun below

    def kept(cells, settings):
        measured = real_measure(cells, settings)
        rows.extend(copy.deepcopy(measured))
        return measured

    monkeypatch.setattr(step_cell, "measure", kept)
    assert main(["bench", f"matrix={write_matrix(tmp_path, STEP)}", f"out={out}"]) == 0
    results = pd.read_csv(out / "results.csv")
    for column in (
        "cell",
        "status",
        "model",
        "imgsz",
        "batch",
        "recompute",
        "recompute_mode",
        "peak_MiB",
        "step_time_s",
        "time_ratio",
        "flop_bound",
        "layers",
        "recomputations_per_step",
        "attention_chunks_per_step",
        "loss_images_recomputed_per_step",
        "time_ratio_low",
        "time_ratio_high",
        "same_gradients",
    ):
        assert column in results, column
    none, full = results.to_dict("records")
    assert none["status"] == full["status"] == "ok"
    assert none["time_ratio"] == 1 and none["flop_bound"] == 1 and none["recomputations_per_step"] == 0
    # 16 tokens at stride 32: the attention region runs stock's product (no chunk pass); all is exact
    assert none["attention_chunks_per_step"] == full["attention_chunks_per_step"] == 0
    assert none["same_gradients"] and full["same_gradients"] and full["time_ratio_low"] == full["time_ratio_high"]  # one pair
    # every layer but Detect and Detect's 6 branches (cv2, cv3 at 3 scales), each once per step
    assert full["layers"] == 17 and full["recomputations_per_step"] == 17 + 6
    # detect: no mask loss (its loss region chunks the assigner)
    assert none["loss_images_recomputed_per_step"] == full["loss_images_recomputed_per_step"] == 0
    assert full["peak_MiB"] < none["peak_MiB"] and 1.1 < full["flop_bound"] < 1.4
    md = (out / "results.md").read_text()
    assert "| yolo11n.yaml | 128 | 1 | False | none | 0 | 0 | 0 |" in md and "+0.0%" in md and "Command of the last run:" in md
    assert (out / "memory_vs_time.png").stat().st_size > 1000 and (out / "matrix.yaml").is_file()

    assert results["machine"].str.contains(" cores, ").all() and results["versions"].str.startswith("yolo_ckpt ").all()
    assert pd.to_datetime(results["date"], format="%Y-%m-%d").notna().all() and "Measured on " in md

    # a rerun skips the finished cells: nothing is measured again, and nothing is written
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    monkeypatch.setattr(step_cell, "measure", lambda *a: pytest.fail("a finished cell ran again"))
    assert main(["bench", f"matrix={write_matrix(tmp_path, STEP)}", f"out={out}"]) == 0
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == files
    # rerun=True measures every cell again (asked of the measurement; its rows are the first run's, not measured twice)
    measured = []
    monkeypatch.setattr(step_cell, "measure", lambda cells, settings: measured.extend(cells) or copy.deepcopy(rows))
    assert main(["bench", f"matrix={write_matrix(tmp_path, STEP)}", f"out={out}", "rerun=True"]) == 0
    assert [c["recompute"] for c in measured] == ["none", "all"] and len(pd.read_csv(out / "results.csv")) == 2
    # issue 47: the record ties each run leg to this checkout's commit; the first leg is kept under earlier_runs
    record = json.loads((out / "record.json").read_text())
    assert record["commit"] == git_state()["commit"] and record["seeds"] == [0] and record["kind"] == "step"
    assert [leg["commit"] for leg in record["earlier_runs"]] == [record["commit"]] and set(record["earlier_runs"][0]) == set(LEG)
    # cells=1 alone in a new folder (issue 43: results.md's memory column was empty without the none cell): its baseline,
    # measured beside it, gets its row, and the deltas are against it
    other = tmp_path / "cells-1"
    assert main(["bench", f"matrix={write_matrix(tmp_path, STEP)}", f"out={other}", "cells=1"]) == 0
    assert list(pd.read_csv(other / "results.csv")["recompute"]) == ["none", "all"]
    (row,) = [line for line in (other / "results.md").read_text().splitlines() if "| all |" in line]
    assert f"| {100 * (full['peak_MiB'] / none['peak_MiB'] - 1):+.1f}% |" in row, row
    # a run stopped before its end leaves results.csv alone: a rerun measures nothing and writes its table and record
    md, record = (other / "results.md").read_text(), json.loads((other / "record.json").read_text())
    (other / "results.md").unlink()
    (other / "record.json").unlink()
    monkeypatch.setattr(step_cell, "measure", lambda *a: pytest.fail("a finished cell ran again"))
    assert main(["bench", f"matrix={write_matrix(tmp_path, STEP)}", f"out={other}", "cells=1"]) == 0
    assert (other / "results.md").read_text() == md and json.loads((other / "record.json").read_text())["commit"] == record["commit"]


COMMITTED = sorted(p.parent.name for p in (ROOT / "benchmarks" / "results").glob("*/matrix.yaml"))


@pytest.mark.parametrize("folder", COMMITTED)
def test_committed_results_unchanged_by_a_rerun(folder, tmp_path, monkeypatch, request):
    """The README's bench command over a committed results folder (its matrix, the settings its command gave):
    every cell is done, so nothing runs and every file stays byte-identical (the record and results.md are not
    relabelled with this machine)."""
    import json

    from ultralytics.cfg import parse_key_value_pair

    committed = ROOT / "benchmarks" / "results" / folder
    out = shutil.copytree(committed, tmp_path / folder)
    command = json.loads((committed / "record.json").read_text())["command"].split()[2:]
    settings = [w for w in command if parse_key_value_pair(w)[0] not in {"matrix", "out", "datasets"}]
    spec = yaml.safe_load((committed / "matrix.yaml").read_text())
    if any(d not in BUILT_IN_DATASETS for block in spec["grid"] for d in np.atleast_1d(block.get("dataset", "synthetic"))):
        settings.append(f"datasets={request.getfixturevalue('shared_datasets')}")
    monkeypatch.setattr(matrix, "_run_group", lambda *a: pytest.fail("a finished cell ran again"))
    assert main(["bench", f"matrix={out / 'matrix.yaml'}", f"out={out}", *settings]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in committed.iterdir())
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in committed.iterdir())
    assert pd.read_csv(committed / "results.csv")[["machine", "versions", "date"]].notna().all().all()  # provenance per row


def test_dataset_roots_in_order(tmp_path, monkeypatch, capsys):
    """A matrix's dataset name is looked for in the bench's datasets=, then the matrix's datasets_dir, then
    Ultralytics' SETTINGS['datasets_dir'] (read, not written); not found: one line naming the three, nothing written."""
    for root in ("given", "own", "ultralytics"):
        for name in {"given": ["a"], "own": ["a", "b"], "ultralytics": ["a", "b", "c"]}[root]:
            (tmp_path / root / name).mkdir(parents=True)
            (tmp_path / root / name / "data.yaml").write_text("path: .\n")
    monkeypatch.setattr(bench, "ULTRALYTICS_SETTINGS", {**bench.ULTRALYTICS_SETTINGS, "datasets_dir": str(tmp_path / "ultralytics")})
    spec = {"kind": "train", "settings": {}, "datasets_dir": "own", "grid": [{"dataset": ["a", "b", "c"], "recompute": "none"}]}
    path = write_matrix(tmp_path, spec)
    assert bench.load_matrix(path, datasets=tmp_path / "given").data == {
        "a": str(tmp_path / "given" / "a" / "data.yaml"),
        "b": str(tmp_path / "own" / "b" / "data.yaml"),
        "c": str(tmp_path / "ultralytics" / "c" / "data.yaml"),
    }
    assert bench.load_matrix(path).data["a"] == str(tmp_path / "own" / "a" / "data.yaml")
    missing = write_matrix(tmp_path, {**spec, "datasets_dir": "absent", "grid": [{"dataset": "d", "recompute": "none"}]}, "missing.yaml")
    out = tmp_path / "out"
    assert main(["bench", f"matrix={missing}", f"out={out}", f"datasets={tmp_path / 'given'}"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and (
            f"dataset='d' not found: no d/data.yaml in datasets= {tmp_path / 'given'}; the matrix's datasets_dir "
            f"{tmp_path / 'absent'} (absent); "
            f"Ultralytics' SETTINGS['datasets_dir'] {tmp_path / 'ultralytics'}; give datasets=DIR"
        )
        in err
    ), err
    assert not out.exists()


@pytest.mark.slow
def test_failed_cell_is_recorded_and_the_rest_run(tmp_path, one_thread):
    # a small model: the failing cell's planning calibrates its loss and makes a fake pass (per op: a nano model's cost seconds)
    cell = {**STEP["grid"][0], "model": tiny_yaml(tmp_path), "recompute": ["none", "auto", "backbone"], "memory_budget": "0.3x"}
    spec = {**STEP, "grid": [cell]}
    results = matrix.run_matrix(write_matrix(tmp_path, spec), tmp_path / "out")
    status = dict(zip(results["recompute"], results["status"]))
    assert status == {"none": "ok", "auto": "failed", "backbone": "ok"}
    reason = results.loc[results["recompute"] == "auto", "reason"].item()
    assert "PlanError" in reason and "below the smallest plan's need" in reason  # 0.3x of none: even 'all' cannot fit
    assert "Failed cells:" in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.slow
def test_train_matrix_same_weights(tmp_path, synthetic, one_thread):
    spec = {
        "kind": "train",
        # estimate=False: no set-up estimate in either run (the cells' peaks are measured)
        "settings": {
            "epochs": 1, "nbs": 2, "seed": 0, "workers": 0, "device": "cpu", "plots": False, "val_images": 2, "fraction": 0.5,
            "estimate": False,
        },
        # imgsz 128: at 64 the probed step's peak is its optimizer step (parameters, gradients, AdamW state), which
        # recomputation does not touch
        "grid": [{"model": "yolo11n.yaml", "dataset": synthetic("detect"), "imgsz": 128, "batch": 2, "recompute": ["none", "all"]}],
    }
    out = tmp_path / "out"
    assert main(["bench", f"matrix={write_matrix(tmp_path, spec)}", f"out={out}"]) == 0
    results = pd.read_csv(out / "results.csv")
    for column in ("weights_sha256", "mAP50", "mAP50-95", "peak_MiB", "step_time_s", "run_dir", "recomputations", "epochs_run"):
        assert column in results, column
    none, full = results.to_dict("records")
    assert none["status"] == full["status"] == "ok" and none["train_images"] == 4  # fraction=0.5 of the 8 images
    assert full["recomputations"] > 0 and none["recomputations"] == 0  # the policy ran, and the baseline did not
    assert none["weights_sha256"] == full["weights_sha256"]  # recomputation is exact on the CPU
    assert full["mAP50-95"] == none["mAP50-95"] and full["peak_MiB"] < none["peak_MiB"]
    table = bench.load_matrix(write_matrix(tmp_path, spec))
    md = (out / "results.md").read_text()
    assert md.count("| yes |") == 2 and "+0.0" in md, md  # same weights as the baseline; mAP50-95 delta 0 points
    assert (out / "map_vs_imgsz.png").is_file() and len(table.cells) == 2
    # the validation subset is a list file of 2 images; the dataset itself is untouched
    assert len((out / "data" / f"{Path(synthetic('detect')).parent.name}-val2.txt").read_text().splitlines()) == 2
    # compare on the two runs gives the same deltas
    assert none["run_dir"] == f"runs/{Path(none['run_dir']).name}"  # issue 47: relative to out, no machine path
    assert main(["compare", str(out / none["run_dir"]), str(out / full["run_dir"]), f"out={tmp_path / 'cmp'}"]) == 0
    compared = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert compared["memory_change_pct"].iloc[1] == pytest.approx(100 * (full["peak_MiB"] / none["peak_MiB"] - 1))


@pytest.mark.slow
def test_killed_train_cell_resumes_to_the_uninterrupted_weights(tmp_path, one_thread, monkeypatch):
    """A train cell killed after its first epoch's checkpoint is recorded as failed; the matrix's rerun resumes it
    (exactly) and records the weights of the same cell trained without a stop, with the killed run's epoch time in
    its wall time. A run of other settings in the cell's folder is not resumed."""
    from yolo_ckpt.train.trainer import CheckpointTrainerMixin

    data = large_box_dataset(tmp_path / "data", "detect", images=8)
    spec = {
        "kind": "train",
        "settings": {"epochs": 2, "nbs": 6, "seed": 0, "workers": 0, "device": "cpu", "plots": False, "estimate": False, "val": False},
        "grid": [{"model": tiny_yaml(tmp_path), "dataset": data, "imgsz": 64, "batch": 2, "recompute": "none"}],
    }
    whole = matrix.run_matrix(write_matrix(tmp_path, spec), tmp_path / "whole").iloc[0]
    save = CheckpointTrainerMixin.save_model

    def killed(trainer):
        save(trainer)
        if trainer.epoch == 0:
            raise RuntimeError("killed after epoch 1")

    monkeypatch.setattr(CheckpointTrainerMixin, "save_model", killed)
    out = tmp_path / "killed"
    assert matrix.run_matrix(write_matrix(tmp_path, spec), out).iloc[0]["status"] == "failed"
    monkeypatch.setattr(CheckpointTrainerMixin, "save_model", save)
    run_dir = out / "runs" / Path(whole["run_dir"]).name
    first = train_cell.trained_seconds(run_dir)
    assert first > 0 and train_cell.interrupted_run(run_dir, {"epochs": 3}) is None  # other settings: trained anew
    with logged_messages() as log:
        resumed = matrix.run_matrix(write_matrix(tmp_path, spec), out).iloc[0]
    assert any("resume: exact from resume_state.pt" in m for m in log)
    assert resumed["status"] == "ok" and resumed["epochs_run"] == 2 and out / resumed["run_dir"] == run_dir
    assert resumed["weights_sha256"] == whole["weights_sha256"]
    assert resumed["wall_s"] > first
    # the whole run's epochs, pixels and best epoch (val=False: best.pt is written every epoch); its time split in two
    assert resumed["pixels_M"] == whole["pixels_M"] == 2 * 8 * 64**2 / 1e6 and resumed["best_epoch"] == whole["best_epoch"] == 2
    assert resumed["train_s"] + resumed["val_s"] == pytest.approx(resumed["wall_s"]) and resumed["val_s"] > 0


@pytest.mark.parametrize("asked", [-1, 0.6])
def test_interrupted_autobatch_cell_resumes(tmp_path, asked):
    """A cell of batch=-1 (or an AutoBatch fraction) saves the batch AutoBatch chose; its rerun resumes that run.
    Before, the saved 2 never equalled the asked -1 and a 30-epoch cell restarted from epoch 1 in a folder of its own."""
    weights = tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    saved = {"epochs": 50, "imgsz": 640, "batch": 2, "nbs": 64, "data": "d.yaml"}
    torch.save({"epoch": 29, "train_args": saved, "optimizer": {"state": {}}, "model": None}, weights / "last.pt")
    run = tmp_path / "run"
    assert train_cell.interrupted_run(run, {"imgsz": 640, "batch": asked, "nbs": 64}) == weights / "last.pt"
    assert train_cell.interrupted_run(run, {"imgsz": 640, "batch": 4, "nbs": 64}) is None  # a fixed batch must match
    assert train_cell.interrupted_run(run, {"imgsz": 640, "batch": asked, "nbs": 16}) is None  # other settings


@pytest.mark.slow
def test_tiles_cell_trains_on_tiles_and_validates_on_full_images(tmp_path, one_thread, monkeypatch):
    from ultralytics.engine.model import Model

    from yolo_ckpt.data.small_objects import small_object_dataset

    validations, stock_val = [], Model.val

    def val(self, validator=None, **kwargs):  # the full-image validations validate as the run did: its max_det
        validations.append(kwargs.get("max_det"))
        return stock_val(self, validator=validator, **kwargs)

    monkeypatch.setattr(Model, "val", val)
    data = small_object_dataset(64, 1, 1, root=tmp_path / "cache")
    spec = {
        "kind": "train",
        "settings": {"epochs": 1, "nbs": 2, "seed": 0, "workers": 0, "device": "cpu", "plots": False, "estimate": False, "max_det": 7},
        "grid": [
            {
                "model": "yolo26n.yaml",
                "dataset": str(data),
                "imgsz": 64,
                "batch": 2,
                "recompute": "none",
                "tiles": {"size": 32, "overlap": 0},
            }
        ],
    }
    out = tmp_path / "out"
    assert main(["bench", f"matrix={write_matrix(tmp_path, spec)}", f"out={out}"]) == 0
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert row["status"] == "ok" and row["imgsz_used"] == 32 and row["val_imgsz"] == 64
    assert row["train_images"] == 4 and row["wall_s"] > 0  # 1 image of 64 px in 2 x 2 tiles of 32 px
    assert (out / row["run_dir"] / "val-full").is_dir() and validations == [7, 7]  # best and last, at the run's max_det
    assert "tiles={'overlap': 0, 'size': 32}" in row["cell"] and (out / "curves.csv").is_file() and (out / "curves.png").is_file()
    assert "| 32 px, overlap 0 | 4 | 64 |" in (out / "results.md").read_text()  # tiles trained, their count, val imgsz
    tiles = next((out / "data").glob("tiles-*"))
    assert len(list((tiles / "images" / "val").iterdir())) == 4  # 1 val image: validated on its tiles while training


@pytest.mark.slow
def test_segment_tiles_cell_trains_on_polygon_tiles_and_validates_on_full_images(tmp_path, one_thread):
    """Issue 46: a segmentation tiles cell end to end: polygons clipped into the tiles, masks validated on the full images."""
    from yolo_ckpt.data.dense import dense_segment_dataset

    data = dense_segment_dataset(9, 128, 2, root=tmp_path / "cache")  # nuclei on a 3 x 3 grid: the middle ones cross x, y = 64
    spec = {
        "kind": "train",
        "settings": {"epochs": 1, "nbs": 2, "seed": 0, "workers": 0, "device": "cpu", "plots": False, "estimate": False},
        "grid": [{"model": "yolo11n-seg.yaml", "dataset": str(data), "imgsz": 128, "batch": 2, "recompute": "none"}],
    }
    spec["grid"][0]["tiles"] = {"size": 64, "overlap": 0}
    out = tmp_path / "out"
    assert main(["bench", f"matrix={write_matrix(tmp_path, spec)}", f"out={out}"]) == 0
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert row["status"] == "ok" and row["imgsz_used"] == 64 and row["val_imgsz"] == 128 and row["train_images"] == 8
    assert (out / row["run_dir"] / "val-full").is_dir() and 0 <= row["mAP50-95"] <= row["mAP50"] <= 1  # the masks' figures
    # per-arm figures (issue 46): time split into training and validation, pixels trained, best and last epochs' masks and
    # boxes (a tiles cell's both validated on the full images), per-class AP
    assert row["val_s"] > 0 and row["train_s"] > 0 and row["train_s"] + row["val_s"] == pytest.approx(row["wall_s"])
    assert row["pixels_M"] == 1 * 8 * 64**2 / 1e6 and row["best_epoch"] == 1 and (out / row["run_dir"] / "val-full-last").is_dir()
    figures = ("last_mAP50", "last_mAP50-95", "box_mAP50", "box_mAP50-95", "last_box_mAP50", "last_box_mAP50-95")
    assert all(0 <= row[c] <= 1 for c in figures)
    assert row["last_mAP50"] == row["mAP50"] and list(json.loads(row["class_AP50-95"])) == ["nucleus"]  # one epoch: best is last
    assert "| best epoch | steps | Mpx |" in (out / "results.md").read_text() and "| nucleus 0." in (out / "results.md").read_text()
    assert pd.read_csv(out / "curves.csv")["metrics/mAP50(M)"].notna().all()  # the curve of the masks, as the row's mAP50
    lines = [line.split() for f in next((out / "data").glob("tiles-*")).glob("labels/*/*.txt") for line in f.read_text().splitlines()]
    assert lines and all(len(fields) >= 7 and len(fields) % 2 for fields in lines)  # polygons, not boxes
    assert any({"0.000000", "1.000000"} & set(fields[1:]) for fields in lines)  # some clipped at a tile's edge


def four_arms(tmp_path, arm: dict, budget: int, baseline_keys: list, auto: dict, overlap: int, **settings):
    """The four arms of a study under one budget of ``budget`` MiB (issues 33 and 46), run by ``bench`` at a tiny size:
    (a) stock at the largest imgsz that fits (imgsz=fit), (b) ``arm`` with ``auto`` (recompute=auto, ...), (c) stock on
    tiles of the size that fits (``overlap`` px), validated on the full images, (d) stock at full size with no budget,
    every arm against (d) (``baseline_keys``); ``settings`` added to the matrix's. Asserts what every such study shows:
    each arm ran; (a) and (c) below the full size, (c) validated at it on more images than it has; (b) recomputed, and
    its weights are (d)'s (recomputation and planning leave the training as it was); (a)-(c) are measured within the
    budget, (d) above it. Returns the four result rows, the output folder and the matrix."""
    imgsz, limit = arm["imgsz"], f"{budget}MiB"
    spec = {
        "kind": "train",
        "baseline_keys": baseline_keys,
        "settings": {"epochs": 1, "nbs": 2, "seed": 0, "workers": 0, "device": "cpu", "plots": False, "estimate": False, **settings},
        "grid": [
            {**arm, "imgsz": "fit", "recompute": "none", "memory_budget": limit},
            {**arm, **auto, "memory_budget": limit},
            {**arm, "recompute": "none", "memory_budget": limit, "tiles": {"size": "fit", "overlap": overlap}},
            {**arm, "recompute": "none"},
        ],
    }
    out = tmp_path / "out"
    assert main(["bench", f"matrix={write_matrix(tmp_path, spec)}", f"out={out}"]) == 0
    rows = fit, auto_row, tiles, full = pd.read_csv(out / "results.csv").to_dict("records")
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert fit["imgsz_used"] < imgsz and tiles["imgsz_used"] < imgsz and tiles["val_imgsz"] == imgsz and tiles["train_images"] > 2
    assert auto_row["recomputations"] > 0 and auto_row["weights_sha256"] == full["weights_sha256"]  # (b) trained as (d) did
    assert max(fit["peak_MiB"], auto_row["peak_MiB"], tiles["peak_MiB"]) <= budget < full["peak_MiB"], rows
    return rows, out, bench.load_matrix(write_matrix(tmp_path, spec))


@pytest.mark.slow
def test_regime_arms_matrix(tmp_path, one_thread):
    """Issue 46's regime arms (``regime-monuseg``'s shape) on dense synthetic nuclei (:func:`four_arms`): a budget below
    stock's batch-1 peak at full size; (b) is recompute=auto with batch=-1 (all, then the largest batch: 2), and (d)
    has (b)'s batch: batch=-1's planning leaves the training as it was."""
    from yolo_ckpt.data.dense import dense_segment_dataset

    data = str(dense_segment_dataset(60, 256, 2, root=tmp_path / "cache"))  # plan at 120 MiB: none 269 at batch 2
    arm = {"model": "yolo11n-seg.yaml", "dataset": data, "imgsz": 256, "batch": 2}
    # every arm against (d), (b)'s batch being -1
    (fit, auto, tiles, full), _, _ = four_arms(
        tmp_path, arm, 120, ["dataset", "model"], {"batch": -1, "recompute": "auto"}, 16, max_det=1000
    )
    assert auto["recomputed"] == "all" and auto["batch_used"] == full["batch_used"] == 2


def test_curves_keep_cells_whose_run_folder_is_gone(tmp_path):
    from yolo_ckpt.bench.plots import _curves

    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame({"epoch": [1, 2], "time": [1.0, 2.0], "metrics/mAP50(B)": [0.1, 0.2], "metrics/mAP50-95(B)": [0.0, 0.1]}).to_csv(
        run / "results.csv", index=False
    )
    row = {"dataset": "d", "imgsz_used": 64, "tiles": None, "train_images": 2, "mAP50": 0.2, "mAP50-95": 0.1}
    ok = pd.DataFrame([{**row, "policy": "all", "run_dir": str(run)}, {**row, "policy": "none", "run_dir": str(tmp_path / "gone")}])
    earlier = {
        "epoch": [1],
        "time": [1.0],
        "metrics/mAP50(B)": [0.5],
        "metrics/mAP50-95(B)": [0.3],
        "full_mAP50": [None],
        "full_mAP50_95": [None],
    }
    pd.concat([pd.DataFrame({**earlier, "cell": [label]}) for label in ("d none @64", "d stale @64")]).to_csv(
        tmp_path / "curves.csv", index=False
    )
    _curves(SimpleNamespace(name="m"), ok, tmp_path)
    curves = pd.read_csv(tmp_path / "curves.csv")
    assert curves["cell"].tolist() == ["d all @64", "d all @64", "d none @64"]  # the gone run's row kept, the stale one not
    assert curves["metrics/mAP50(B)"].tolist() == [0.1, 0.2, 0.5] and (tmp_path / "curves.png").is_file()


def test_curves_count_seconds_over_resumes():
    """A resumed run's results.csv restarts its ``time`` at each resume: the curves count on from the last saved epoch."""
    from yolo_ckpt.bench.plots import training_seconds

    time = pd.Series([10.0, 20.0, 30.0, 12.0, 25.0, 5.0])  # epochs 1-3, resumed for 4-5, resumed again for 6
    assert training_seconds(time).tolist() == [10.0, 20.0, 30.0, 42.0, 55.0, 60.0]
    assert training_seconds(pd.Series([1.0, 2.0])).tolist() == [1.0, 2.0]


def test_val_subset(tmp_path, shared_datasets):
    data = str(shared_datasets / "aerial-cars" / "data.yaml")
    subset = train_cell.val_subset(data, 3, tmp_path)
    spec = yaml.safe_load(subset.read_text())
    listed = Path(spec["val"]).read_text().splitlines()
    assert len(listed) == 3 and all(Path(p).is_file() and "/images/val/" in p for p in listed)
    assert spec["train"] == "images/train" and Path(spec["path"]) == (shared_datasets / "aerial-cars").resolve()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kind": "steps"}, "kind='steps' is not valid; valid kinds: step, train"),
        ({"grid": [{"model": "yolo11n.yaml", "recompte": "all"}]}, "unknown cell keys ['recompte']"),
        ({"grid": [{"model": "yolo11n.yaml", "recompute": ["none", "C3k3"]}]}, "did you mean 'C3k2'?"),
        ({"grid": [{"model": "yolo11n.yaml", "recompute": "all"}]}, "no baseline cell"),
        ({"grid": [{"model": "yolo11n.yaml", "recompute": ["none", "auto"]}]}, "recompute=auto need memory_budget="),
        (
            {"grid": [{"model": "yolo11n.yaml", "task": "segmentation", "recompute": "none"}]},
            "step cells measure the tasks detect, segment, pose, obb, classify, semantic, depth",
        ),
        ({"grid": [{"model": "yolo11n.yaml", "imgsz": "big", "recompute": "none"}]}, "imgsz='big' is not valid"),
        ({"settings": {"pair": 3}}, "unknown settings ['pair']"),
        ({"kind": "train", "settings": {}, "grid": [{"dataset": "nowhere", "recompute": "none"}]}, "dataset='nowhere' not found"),
        ({"kind": "train", "settings": {"epoch": 3}}, "'epoch' is not a valid YOLO argument"),
        ({"kind": "train", "settings": {"imgsz": 640}}, "settings ['imgsz'] are set per cell by the runner"),
        ({"grid": [{"model": "yolo11n.yaml", "amp": "yes", "recompute": "none"}]}, "amp='yes' is not valid"),
        ({"settings": {"pairs": 0}}, "pairs=0 is not valid; valid: an int >= 1"),
        ({"settings": {"objects": "abc"}}, "objects='abc' is not valid; valid: an int >= 1"),
        (
            {"grid": [{"model": "yolo11n.yaml", "imgsz": "fit", "recompute": ["none", "auto"], "memory_budget": "1GB"}]},
            "imgsz=fit needs a named policy",
        ),
        ({"grid": [{"model": "missing.yaml", "recompute": "none"}]}, "missing.yaml"),
        ({"grid": [{"model": "yolo11n.yaml", "recompute": "none", "tiles": {"size": 64, "overlap": 0}}]}, "tiles= is for train cells"),
        ({"kind": "train", "settings": {}, "grid": [{"recompute": "none", "tiles": {"size": 64}}]}, "tiles={'size': 64} is not valid"),
        (
            {"kind": "train", "settings": {}, "grid": [{"recompute": "none", "tiles": {"size": 999, "overlap": 0}}]},
            "tiles size=999 is not valid",
        ),
        (
            {"grid": [{"model": "yolo11n.yaml", "recompute": ["none", "auto"], "memory_budget": "12XB"}]},
            "memory_budget=12XB: memory_budget='12XB': unknown unit 'XB'",
        ),
        (
            {"grid": [{"model": "yolo11n.yaml", "recompute": "none", "memory_budget": "0x"}]},
            "memory_budget='0x' is not valid; valid: bytes with a unit (2GB), a fraction",
        ),
        (
            {"kind": "train", "settings": {}, "grid": [{"recompute": "none", "memory_budget": "0.6x"}]},
            "memory_budget=0.6x (relative to recompute=none) is for step cells",
        ),
        ({"grid": [{"model": "yolo11n.yaml", "recompute": "none", "recompute_mode": "partial"}]}, "valid modes: full, selective"),
        ({"kind": "train", "settings": {"estimate": "no"}, "grid": [{"recompute": "none"}]}, "estimate='no' is not valid; valid: True"),
        (  # 200,000 cells: refused at once (it was checked for minutes, printing nothing)
            {"grid": [{"model": "yolo11n.yaml", "recompute": "none", "imgsz": list(range(32, 12832, 32)), "batch": list(range(1, 501))}]},
            "the grid has 200000 cells (its blocks' products); at most 10000",
        ),
    ],
)
def test_bad_matrix_fails_before_anything_runs(tmp_path, capsys, change, message):
    out = tmp_path / "out"
    assert main(["bench", f"matrix={write_matrix(tmp_path, {**STEP, **change})}", f"out={out}"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cell_budget_forms():
    """A cell's budget: Budget's forms, plus the bench's own factor of the recompute=none peak."""
    from yolo_ckpt.bench.cells import RelativeBudget, cell_budget
    from yolo_ckpt.config import Budget

    assert cell_budget(None) is None and cell_budget("2GB") == Budget.parse("2GB") and cell_budget(0.5).is_fraction
    assert cell_budget(" 0.6x") == RelativeBudget(0.6) and cell_budget("0.6x").bytes(1000) == 600
    for bad in ("x", "-1x", "infx", "nanx"):
        with pytest.raises(ValueError, match=f"memory_budget={bad!r} is not valid; valid: .* a factor of the recompute=none peak"):
            cell_budget(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check is for machines without a CUDA device")
def test_fraction_budget_needs_cuda(tmp_path, capsys):
    out = tmp_path / "out"
    spec = {**STEP, "grid": [{**STEP["grid"][0], "recompute": ["none", "auto"], "memory_budget": 0.5}]}
    assert main(["bench", f"matrix={write_matrix(tmp_path, spec)}", f"out={out}"]) == 2
    assert "memory_budget=0.5 is a fraction of CUDA memory and this machine has no CUDA device" in capsys.readouterr().err
    assert not out.exists()


def test_fits_budget_only_for_bytes():
    from yolo_ckpt.bench.tables import _fits

    assert (_fits("1GB", 100.0), _fits("1MB", 100.0)) == ("yes", "no")  # 100 MiB against 1e9 and 1e6 bytes
    assert _fits("0.6", 100.0) == _fits("0.6x", 100.0) == _fits(float("nan"), 100.0) == ""  # CUDA fraction, factor, none


def test_bench_arguments(tmp_path, capsys):
    assert main(["bench", "yolo_ckpt/cfg/bench/cpu-step.yaml"]) == 2  # a bare word: matrix= is required
    assert "bench takes matrix=NAME or matrix=FILE" in capsys.readouterr().err
    for missing in (tmp_path / "none.yaml", "cpu-stepp"):  # neither a file nor a shipped name: one line, the names
        assert main(["bench", f"matrix={missing}"]) == 2
        err = capsys.readouterr().err
        shipped_names = (
            "shipped: accuracy, cpu-step, dense-seg, equal-memory-bccd-steps, equal-memory-bccd, equal-memory-deeppcb-steps,"
            " equal-memory-deeppcb, gpu"
        )
        assert err.count("\n") == 1 and f"matrix={missing}: no such file" in err and shipped_names in err


@pytest.mark.parametrize("name", sorted(shipped("bench")))
def test_shipped_matrices_are_valid(name, shared_datasets):
    m = bench.load_matrix(name)
    assert m.cells and all(m.baseline_of(c) is not None for c in m.cells)


def test_cells_picks_cells_by_number(tmp_path, capsys):
    """cells= runs the cells of these numbers (file order from 0, as dry=True lists them); a number the matrix has not
    is one line naming its range, exit 2, nothing written."""
    matrix = bench.load_matrix(write_matrix(tmp_path, STEP))
    assert bench.select_cells(matrix, None) == matrix.cells and bench.select_cells(matrix, 1) == matrix.cells[1:]
    assert bench.select_cells(matrix, "1,0") == bench.select_cells(matrix, (0, 1)) == matrix.cells
    for bad in (2, "a", "0,-1", [], True):
        with pytest.raises(ValueError, match=r"is not valid for matrix m: give numbers of its 2 cells, 0 to 1"):
            bench.select_cells(matrix, bad)
    assert main(["bench", f"matrix={tmp_path / 'm.yaml'}", "cells=5", f"out={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.real_data
def test_one_cell_of_a_real_data_matrix_by_name(tmp_path, shared_datasets, one_thread):
    """matrix=real-data by name, cells= its cheapest cell (deeppcb, recompute=none at 640, batch 2) with the fewest
    steps its keys allow (the matrix's one epoch, of 2 training images here: one step; val_images=1; no set-up
    estimate, a yolo-ckpt train key the settings take: its fake passes take longer than the step): one ok row. It
    trains on a copy of those images (datasets= is searched first); the matrix's other datasets are linked to
    ../shared/datasets, whose data.yaml the matrix check reads (their cells do not run: nothing is written there)."""
    matrix = bench.load_matrix("real-data", datasets=shared_datasets)  # by name, wherever the package is installed
    cell = next(i for i, c in enumerate(matrix.cells) if (c["dataset"], c["imgsz"], c["recompute"]) == ("deeppcb", 640, "none"))
    datasets, source = tmp_path / "datasets", shared_datasets / "deeppcb"
    for name in {c["dataset"] for c in matrix.cells} - {"deeppcb"}:
        (datasets / name).parent.mkdir(parents=True, exist_ok=True)
        (datasets / name).symlink_to(shared_datasets / name)
    for split, n in (("train", 2), ("val", 1)):
        for image in sorted((source / "images" / split).iterdir())[:n]:
            for kind, path in (("images", image), ("labels", source / "labels" / split / f"{image.stem}.txt")):
                (datasets / "deeppcb" / kind / split).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, datasets / "deeppcb" / kind / split / path.name)
    shutil.copyfile(source / "data.yaml", datasets / "deeppcb" / "data.yaml")
    out = tmp_path / "out"
    assert main(["bench", "matrix=real-data", f"cells={cell}", f"datasets={datasets}", f"out={out}", "val_images=1", "estimate=False"]) == 0
    (row,) = pd.read_csv(out / "results.csv").to_dict("records")
    assert (row["status"], row["dataset"], row["recompute"], row["train_images"], row["recomputations"]) == ("ok", "deeppcb", "none", 2, 0)


def test_provenance_names_the_cpu_as_ultralytics_does(monkeypatch):
    """Issue 32: the CPU model of a result's provenance is Ultralytics' get_cpu_info (no /proc/cpuinfo parsed here);
    on this machine that is /proc/cpuinfo's first model name, as stock cleans it."""
    from ultralytics.utils import torch_utils
    from ultralytics.utils.cpu import CPUInfo

    from yolo_ckpt.bench.results_io import machine_text, provenance

    record = provenance("python -m yolo_ckpt.bench out=x", seeds=[0])
    assert record["machine"]["cpu"] == torch_utils.get_cpu_info() and record["command"] == "python -m yolo_ckpt.bench out=x"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1] for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        assert not names or record["machine"]["cpu"] == CPUInfo._clean(names[0])
    monkeypatch.setattr(torch_utils, "get_cpu_info", lambda: "Test CPU 9000")
    machine = provenance("c", seeds=[0])["machine"]
    assert machine["cpu"] == "Test CPU 9000" and machine_text(machine).startswith("Test CPU 9000, ")


@pytest.mark.slow
def test_equal_memory_arms_matrix(tmp_path, one_thread):
    """Issue 33's four arms under one budget on the built-in small-object data (:func:`four_arms`): (b) is
    recompute=auto at full resolution, standing for full-resolution training; (a) downscales, (c) takes more optimizer
    steps."""
    from yolo_ckpt.data.small_objects import small_object_dataset

    data = str(small_object_dataset(320, 2, 1, root=tmp_path / "cache"))  # stock at 320 needs more than 120 MiB
    arm = {"model": "yolo26n.yaml", "dataset": data, "imgsz": 320, "batch": 2}
    (fit, auto, tiles, full), out, matrix_ = four_arms(tmp_path, arm, 120, ["dataset", "model", "batch"], {"recompute": "auto"}, 32)
    assert fit["recomputed"] == "none"  # downscaled to fit
    assert auto["imgsz_used"] == 320 and auto["recomputed"] not in ("none", "")
    # optimizer steps: one an image pair (nbs=2), 2 images at full size and 4 images' tiles or more for (c)
    assert fit["optimizer_steps"] == auto["optimizer_steps"] == full["optimizer_steps"] == 1 < tiles["optimizer_steps"]
    assert (out / "map_vs_memory.png").is_file() and "| steps |" in (out / "results.md").read_text()
    assert all(matrix_.baseline_of(c) is matrix_.cells[3] for c in matrix_.cells)  # every arm against (d)
