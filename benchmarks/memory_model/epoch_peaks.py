"""Every training step of one epoch measured against the memory model's estimate for the same keys (issue 21's (b)).

The batches are the epoch Ultralytics' own trainer of the task draws at ``seed=0`` (its dataloader: mosaic and the
rest of the run's augmentation, ``fraction=`` of the training set); each is measured as one CPU training step
(:func:`yolo_ckpt.memory.step.profile_step`: forward, loss, backward, AdamW step with its state, fp32) of the model
at its initial weights, with ``recompute=``. Beside them the estimate ``yolo-ckpt plan`` makes for the same keys
(:meth:`yolo_ckpt.memory.planning.PlannedRun.from_keys`: the data's objects bound and box sizes). The weights do not change
between steps: the memory of a step depends on its shapes and targets, and, for segmentation, on how many anchors the
assigner makes foreground, which an untrained model's predictions make fewer than a trained one's (the estimate
bounds those too). ``predictions=overlapping`` measures the steps as a trained model's predictions make them: every
prediction overlaps every object whose box holds its anchor (:func:`overlapping_predictions`), so each object claims
``min(topk, its in-box anchors)`` anchors, the most foreground of a long run::

    python -m benchmarks.memory_model.epoch_peaks datasets=DIR data=deeppcb/data.yaml model=yolo11n.yaml imgsz=640 batch=4
        [recompute=none] [fraction=1.0] [predictions=initial|overlapping] out=benchmarks/results/epoch-peaks-deeppcb

Run it on a copy of a shared dataset: Ultralytics writes a label cache beside the labels.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time

import torch
from ultralytics import YOLO

from yolo_ckpt.bench.results_io import dataset_yaml, provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.memory import PlannedRun, model_task, profile_step

KEYS = ("data", "datasets", "model", "imgsz", "batch", "recompute", "fraction", "predictions", "out")  # the key=value words main takes
PREDICTIONS = ("initial", "overlapping")


@contextlib.contextmanager
def overlapping_predictions():
    """Within it, every task-aligned assigner (``ultralytics/utils/tal.py``: each class that defines ``pair_overlaps``,
    and the loss region's chunked assigners, which call it) computes its candidate pairs' overlaps as before and then
    takes them as 1: each object's ``topk`` best candidates are in its box whenever it holds that many, as with a
    trained model whose predictions overlap the objects, and the step's shapes are those such predictions give. Not
    for YOLO26 segmentation's loss region, whose assigner computes its mask overlaps itself."""
    from ultralytics.utils import tal

    classes = [c for c in vars(tal).values() if isinstance(c, type) and issubclass(c, tal.TaskAlignedAssigner)]
    saved = {c: c.__dict__["pair_overlaps"] for c in classes if "pair_overlaps" in c.__dict__}

    def overlapping(stock):
        def pair_overlaps(self, *args, **kwargs):
            return torch.ones_like(stock(self, *args, **kwargs))

        return pair_overlaps

    for c, stock in saved.items():
        c.pair_overlaps = overlapping(stock)
    try:
        yield
    finally:
        for c, stock in saved.items():
            c.pair_overlaps = stock


def predictions_context(name: str):
    """The context a step is measured in for ``predictions=name``: :func:`overlapping_predictions` or none.

    Raises:
        ConfigError: for a name not in :data:`PREDICTIONS`, naming the valid ones (before any work).
    """
    if name not in PREDICTIONS:
        raise ConfigError(f"predictions={name}: valid values are {', '.join(PREDICTIONS)}")
    return overlapping_predictions if name == "overlapping" else contextlib.nullcontext


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.memory_model.epoch_peaks", required=("data",))
    model_cfg, data = opts.get("model", "yolo11n.yaml"), dataset_yaml(opts["data"], opts.get("datasets"))
    imgsz, batch_size, recompute = int(opts.get("imgsz", 640)), int(opts.get("batch", 2)), opts.get("recompute") or "none"
    fraction, predictions = float(opts.get("fraction", 1.0)), opts.get("predictions", "initial")
    measured_in = predictions_context(predictions)
    start = time.perf_counter()
    run = PlannedRun.from_keys({"model": model_cfg, "data": data, "imgsz": imgsz, "batch": batch_size, "device": "cpu"})
    model, task = run.model, model_task(run.model)
    estimated = run.memory_model().estimate(recompute, batch_size, imgsz).peak_bytes
    overrides = dict(model=model_cfg, data=data, imgsz=imgsz, batch=batch_size, epochs=1, seed=0, fraction=fraction,
                     workers=0, device="cpu", plots=False, project=tempfile.mkdtemp(prefix="epoch-peaks-"), name="run")
    trainer = YOLO(model_cfg, task=task).task_map[task]["trainer"](overrides=overrides)  # Ultralytics' own, seeded
    trainer.model = model  # the loader reads the model's stride
    loader = trainer.get_dataloader(trainer.data["train"], batch_size, rank=-1, mode="train")
    peaks, objects = [], []
    for batch in loader:
        batch = trainer.preprocess_batch(batch)
        with measured_in():
            peaks.append(profile_step(model, batch, recompute, flops=False).peak_bytes)
        objects.append(int(batch["batch_idx"].long().bincount().max()) if len(batch["batch_idx"]) else 0)
        print(f"step {len(peaks)}/{len(loader)}: {peaks[-1] / 2**20:.0f} MiB, {objects[-1]} objects in the densest image", flush=True)
    seconds = time.perf_counter() - start
    largest, median = max(peaks), statistics.median(peaks)
    result = {
        **provenance(["python -m benchmarks.memory_model.epoch_peaks", *argv], seeds=[0]),
        "model": model_cfg, "task": task, "data": opts["data"], "imgsz": imgsz, "batch": batch_size, "recompute": recompute,
        "fraction": fraction, "predictions": predictions, "seed": 0, "steps": len(peaks), "step_peak_bytes": peaks,
        "objects_in_densest_image": objects,
        "largest_step_peak_bytes": largest, "median_step_peak_bytes": median, "estimated_peak_bytes": estimated,
        "estimate_over_largest": estimated / largest, "objects_bound": run.spec.objects, "run_seconds": seconds,
    }
    mib = 2**20
    lines = [
        "| model | data | imgsz | batch | recompute | steps (fraction) | largest step MiB | median MiB | estimated MiB | "
        "estimate / largest | run time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {model_cfg} | {data} | {imgsz} | {batch_size} | {recompute} | {len(peaks)} ({fraction:g}) | {largest / mib:.0f} | "
        f"{median / mib:.0f} | {estimated / mib:.0f} | {estimated / largest:.2f}x | {seconds / 60:.1f} min |",
        "",
        "One epoch at seed=0 as Ultralytics' trainer draws it (mosaic and the run's augmentation), each step measured on "
        "the CPU (fp32, AdamW's state) at the initial weights"
        + (", with predictions that overlap every object (the most foreground: a trained model's)" if predictions == "overlapping" else "")
        + "; the estimate as plan makes it for the same keys. Most "
        f"objects in one image of a batch: {max(objects)} (the estimate's bound: {run.spec.objects}).",
        "",
        run.spec.describe(),
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.memory_model.epoch_peaks"))
