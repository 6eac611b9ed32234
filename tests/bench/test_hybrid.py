"""The hybrid schedule cell (issue 46, item 3; :mod:`yolo_ckpt.bench.hybrid`): tiles, then the full images with
recompute, in one run."""

from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import large_box_dataset, tiny_yaml

from yolo_ckpt import count_recomputations
from yolo_ckpt.bench import matrix
from yolo_ckpt.cli import main
from yolo_ckpt.train.trainer import CheckpointTrainerMixin

# 8 training images of 64 px: 32 tiles of 32 px (overlap 0); batch 4: 8 tile batches an epoch, 2 full ones
SETTINGS = {
    "epochs": 4, "close_mosaic": 2, "nbs": 8, "seed": 0, "workers": 0, "device": "cpu", "plots": False, "estimate": False,
    "optimizer": "AdamW", "warmup_epochs": 0,  # no warmup: each epoch's lr is the schedule's alone
}


def spec(tmp_path, data, **cell) -> dict:
    """A train matrix whose first cell is the tiny detector on ``data`` at 64 px, batch 4, recompute=all, 1 GB, with
    ``cell``'s keys; its second, stock's, is the baseline a matrix needs (not run: :func:`run` runs the first)."""
    base = {"model": tiny_yaml(tmp_path), "dataset": data, "imgsz": 64, "batch": 4, "recompute": "all", "memory_budget": "1GB"}
    grid = [{**base, **cell}, {**base, "recompute": "none", "memory_budget": None}]
    return {"kind": "train", "baseline_keys": ["model"], "settings": dict(SETTINGS), "grid": grid}


def run(tmp_path, spec_: dict, out: Path, monkeypatch) -> tuple[pd.Series, list]:
    """Run the matrix into ``out``; return its row and, per training batch, (trainer, epoch, imgsz, recomputations so
    far, the optimizer's id) as the trainer preprocessed it."""
    seen, preprocess = [], CheckpointTrainerMixin.preprocess_batch

    def spy(trainer, batch):
        batch = preprocess(trainer, batch)
        seen.append((trainer, trainer.epoch, batch["img"].shape[-1], counter.total, id(trainer.optimizer)))
        return batch

    monkeypatch.setattr(CheckpointTrainerMixin, "preprocess_batch", spy)
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(spec_))
    with count_recomputations() as counter:
        row = matrix.run_matrix(path, out, cells=[0]).iloc[0]
    monkeypatch.setattr(CheckpointTrainerMixin, "preprocess_batch", preprocess)
    return row, seen


def per_epoch(seen: list) -> dict:
    """``{epoch: (batches, imgsz)}`` of the batches seen."""
    return {e: (sum(s[1] == e for s in seen), {s[2] for s in seen if s[1] == e}) for e in sorted({s[1] for s in seen})}


def lrs(out: Path, row) -> list:
    """The lr of each epoch (Ultralytics' results.csv, parameter group 0)."""
    return pd.read_csv(out / row["run_dir"] / "results.csv").rename(columns=str.strip)["lr/pg0"].tolist()


@pytest.mark.slow
def test_hybrid_switches_at_close_mosaic_and_keeps_one_schedule(tmp_path, one_thread, monkeypatch):
    """Tiles for epochs 1-2, the full images for 3-4 (close_mosaic=2), in one run: the same optimizer object throughout
    with one step count (AdamW's ``step`` = the EMA's updates = the steps taken), each epoch's lr equal to an
    unswitched run's (a reset schedule would start again at lr0), validation on the full images, recomputation in
    the full epochs and not in the tile ones."""
    data = large_box_dataset(tmp_path / "data", "detect", images=8)
    row, seen = run(tmp_path, spec(tmp_path, data, tiles={"size": 32, "overlap": 0}, hybrid=True), tmp_path / "hybrid", monkeypatch)
    assert row["status"] == "ok", row.get("reason")
    assert per_epoch(seen) == {0: (8, {32}), 1: (8, {32}), 2: (2, {64}), 3: (2, {64})}
    trainer = seen[-1][0]
    assert len({s[4] for s in seen}) == 1  # one optimizer
    state = next(s for s in trainer.optimizer.state.values() if "step" in s)
    assert int(state["step"]) == trainer.ema.updates == row["optimizer_steps"] > 0
    # recomputation in the full epochs only (counted up to each epoch's first batch): none while the tiles trained
    first_full, last = (next(s[3] for s in seen if s[1] == e) for e in (2, 3))
    assert first_full == 0 < last and row["recomputations"] > last
    assert len(trainer.test_loader.dataset) == 2 and trainer.test_loader.dataset.imgsz == 64  # the full val images
    assert row["tile_imgsz"] == 32 and row["switch_epoch"] == 3 and row["imgsz_used"] == row["val_imgsz"] == 64
    assert row["train_images"] == 32 and row["pixels_M"] == (2 * 32 * 32**2 + 2 * 8 * 64**2) / 1e6
    assert "| 32 px, overlap 0, full from epoch 3 | 32 | 64 |" in (tmp_path / "hybrid" / "results.md").read_text()
    plain, _ = run(tmp_path, spec(tmp_path, data), tmp_path / "plain", monkeypatch)
    schedule = lrs(tmp_path / "hybrid", row)
    assert schedule == lrs(tmp_path / "plain", plain) and len(set(schedule)) == 4  # decays every epoch, never reset


@pytest.mark.slow
@pytest.mark.parametrize("killed_after", [0, 2])  # a tile epoch, the first full epoch
def test_killed_hybrid_resumes_in_its_epochs_phase(tmp_path, one_thread, monkeypatch, killed_after):
    """A hybrid cell killed after epoch ``killed_after + 1`` is resumed by the matrix's rerun in the phase of each
    epoch left: tiles before the switch, the full images from it; exactly, in either phase: the weights of the
    uninterrupted run (every leg counts its batches with the tiles' nb, as that run did; a tile-phase resume is taken
    again with the tile loader in place)."""
    data = large_box_dataset(tmp_path / "data", "detect", images=8)
    spec_ = spec(tmp_path, data, tiles={"size": 32, "overlap": 0}, hybrid=True)
    whole = run(tmp_path, spec_, tmp_path / "whole", monkeypatch)[0]
    save = CheckpointTrainerMixin.save_model

    def killed(trainer):
        save(trainer)
        if trainer.epoch == killed_after:
            raise RuntimeError(f"killed after epoch {killed_after + 1}")

    monkeypatch.setattr(CheckpointTrainerMixin, "save_model", killed)
    out = tmp_path / "out"
    row, seen = run(tmp_path, spec_, out, monkeypatch)
    assert row["status"] == "failed" and max(s[1] for s in seen) == killed_after
    monkeypatch.setattr(CheckpointTrainerMixin, "save_model", save)
    row, seen = run(tmp_path, spec_, out, monkeypatch)
    assert row["status"] == "ok" and row["epochs_run"] == 4
    expected = {0: (8, {32}), 1: (8, {32}), 2: (2, {64}), 3: (2, {64})}
    assert per_epoch(seen) == {e: v for e, v in expected.items() if e > killed_after}
    assert row["weights_sha256"] == whole["weights_sha256"] and row["optimizer_steps"] == whole["optimizer_steps"]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"close_mosaic": 4}, "hybrid: close_mosaic=4 epochs at full resolution of epochs=4; valid: an int in [1, 3]"),
        ({"close_mosaic": 0}, "hybrid: close_mosaic=0 epochs"),
        ({"time": 1.0}, "hybrid: time=1.0 changes the epochs"),
        ({"multi_scale": 0.5}, "hybrid: multi_scale=0.5 scales every batch to the run's imgsz"),
    ],
)
def test_bad_switch_is_refused_before_anything_is_written(tmp_path, capsys, settings, message):
    """A switch that leaves no tile or no full epoch, or one the run would move (time=) or batches the tiles would not
    keep (multi_scale=), is refused by the matrix check: one line, exit 2, no folder."""
    spec_ = spec(tmp_path, "synthetic", tiles={"size": 32, "overlap": 0}, hybrid=True)
    spec_["settings"].update(settings)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec_))
    assert main(["bench", f"matrix={path}", f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_hybrid_needs_tiles_and_a_budget(tmp_path, capsys):
    spec_ = spec(tmp_path, "synthetic", hybrid=True)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec_))
    assert main(["bench", f"matrix={path}", f"out={tmp_path / 'out'}"]) == 2
    assert "hybrid: true needs tiles= (the tiles that train first) and memory_budget=" in capsys.readouterr().err


def test_tiles_that_do_not_fit_are_refused_before_the_cell_writes(tmp_path, one_thread):
    """Tiles of the full size (64 px) with recompute=none under a budget that only fits smaller ones: the cell fails
    in one line naming the tile phase, and writes no tiles and no run folder."""
    data = large_box_dataset(tmp_path / "data", "detect", images=2)
    spec_ = spec(tmp_path, data, tiles={"size": 64, "overlap": 0}, hybrid=True, recompute="none", memory_budget="4MiB")
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec_))
    row = matrix.run_matrix(path, tmp_path / "out", cells=[0]).iloc[0]
    assert row["status"] == "failed"
    assert row["reason"].startswith("ConfigError: hybrid: the tiles phase (imgsz=64, batch=4, recompute=none)")
    assert not list((tmp_path / "out").glob("data/tiles-*")) and not (tmp_path / "out" / "runs").exists()
