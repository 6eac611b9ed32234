"""Soak: does recomputation leak? Many short epochs with ``recompute=all`` beside the same run with ``recompute=none``
(both through yolo-ckpt's trainer) and with Ultralytics' own ``DetectionTrainer`` (``stock``).

After every epoch each run records its resident memory (RSS, from ``/proc/self/statm``) and the number and bytes of
live ``torch.Tensor`` objects (``gc``); the slope of each over the epochs after a warm-up is a least-squares fit. A leak
through the engine (counters, the recomputed classes' caches, callbacks, saved tensors kept by a checkpoint) would
make the recomputed run's slopes steeper than stock's. Each arm runs in a fresh interpreter, so one cannot inherit
the other's memory.

    python -m benchmarks.mechanism.soak out=benchmarks/results/soak [epochs=30]
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys

import numpy as np

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command

ARMS = ("stock", "none", "all")
WARMUP_EPOCHS = 5  # allocator pools, dataset caches and the optimizer state settle in the first epochs
# The verdict: a yolo-ckpt run's slope may exceed stock's by at most this much per epoch (noise of the allocator).
LIMITS = {"rss_mib": 0.5, "tensors": 1.0}  # MiB RSS per epoch, live tensors per epoch


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _live_tensors() -> tuple[int, int]:
    import torch

    gc.collect()
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return len(tensors), sum(t.untyped_storage().nbytes() for t in tensors if t.device.type != "meta")


def _arm(recompute: str, epochs: int, data: str, project: str, queue) -> None:
    """One soak run in this (fresh) process; puts its per-epoch rows on ``queue``."""
    os.environ["YOLO_OFFLINE"] = "1"
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolo_ckpt import CheckpointDetectionTrainer

    rows = []

    def record(trainer):
        count, nbytes = _live_tensors()
        rows.append({"epoch": trainer.epoch, "rss_mib": _rss_mib(), "tensors": count, "tensor_mib": nbytes / 2**20})

    model = YOLO("yolo11n.yaml")
    model.add_callback("on_fit_epoch_end", record)
    extra = {"trainer": DetectionTrainer} if recompute == "stock" else {"trainer": CheckpointDetectionTrainer, "recompute": recompute}
    model.train(data=data, epochs=epochs, imgsz=64, batch=2, nbs=2, workers=0, device="cpu", plots=False, seed=0,
                project=project, name=recompute, exist_ok=True, **extra)
    queue.put(rows)


def slope(rows: list[dict], key: str) -> float:
    """Least-squares slope of ``key`` per epoch over the epochs after the warm-up."""
    tail = rows[WARMUP_EPOCHS:]
    return float(np.polyfit([r["epoch"] for r in tail], [r[key] for r in tail], 1)[0])


KEYS = ("epochs", "out")  # the key=value words main takes


def main(argv: list[str]) -> None:
    options = parse_keys(argv, KEYS, "benchmarks.mechanism.soak")
    epochs, out = int(options.get("epochs", 30)), options.get("out")
    import tempfile

    from yolo_ckpt.data.synthetic import synthetic_dataset

    data = str(synthetic_dataset("detect"))
    context = multiprocessing.get_context("spawn")
    runs = {}
    with tempfile.TemporaryDirectory() as project:
        for recompute in ARMS:
            queue = context.Queue()
            process = context.Process(target=_arm, args=(recompute, epochs, data, project, queue))
            process.start()
            runs[recompute] = queue.get(timeout=3600)  # a crashed arm ends the benchmark instead of hanging it
            process.join()
    slopes = {arm: {key: slope(rows, key) for key in ("rss_mib", "tensors", "tensor_mib")} for arm, rows in runs.items()}
    verdict = {arm: all(slopes[arm][k] - slopes["stock"][k] <= limit for k, limit in LIMITS.items()) for arm in ("none", "all")}
    lines = [
        f"# Soak: {epochs} epochs of yolo11n (imgsz 64, batch 2, 8 synthetic images, validation every epoch)",
        "",
        f"Slopes per epoch after {WARMUP_EPOCHS} warm-up epochs (least squares). Limits: a yolo-ckpt run's slope may "
        f"exceed stock's (Ultralytics' DetectionTrainer) by {LIMITS['rss_mib']} MiB RSS and {LIMITS['tensors']} live tensors per epoch.",
        "",
        "| recompute | RSS MiB/epoch | live tensors/epoch | live tensor MiB/epoch | RSS at the end MiB | live tensors at the end |",
        "|---|---|---|---|---|---|",
    ]
    for arm, rows in runs.items():
        s = slopes[arm]
        lines.append(
            f"| {arm} | {s['rss_mib']:+.3f} | {s['tensors']:+.2f} | {s['tensor_mib']:+.4f} | {rows[-1]['rss_mib']:.0f} | "
            f"{rows[-1]['tensors']} |"
        )
    lines += ["", "Within the limits: " + ", ".join(f"recompute={arm} {'yes' if ok else 'NO'}" for arm, ok in verdict.items()) + "."]
    result = {**provenance(["python -m benchmarks.mechanism.soak", *argv], seeds=[0]), "epochs": epochs, "limits": LIMITS,
              "slopes": slopes, "within_limits": verdict, "per_epoch": runs}
    publish(result, lines, out)


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.mechanism.soak"))
