"""How far a long run's densest training sample is from one epoch's, and from the memory model's bound: the
foreground anchors and candidate pairs of every sample Ultralytics' training pipeline draws over ``epochs=`` epochs.

The memory model bounds a segmentation loss's foreground anchors, and every task's candidate pairs, from the labels
(:class:`yolo_ckpt.memory.foreground.ObjectSizes`): every object of the densest image x 4 (mosaic), each at its largest
augmented size. A plan must hold for every step of a run of hundreds of epochs, not only for one epoch's steps, and
the densest mosaics (the densest images together, at the scale that shows all four whole) are rare. This study draws
the samples a run draws (``build_yolo_dataset`` in training mode: mosaic, the random affine, the run's keys; one
sample per image per epoch, mosaic on throughout: ``close_mosaic`` only makes the last epochs sparser) and counts, per
sample, on the anchor grid of the model at ``imgsz``:

- the candidate pairs (object, anchor whose centre is in its box: the assigner's ``select_candidates_in_gts``);
- the foreground any predictions can give: at most ``min(topk, its in-box anchors)`` per object, and at most the
  anchors that lie in some box (``select_highest_overlaps`` leaves each anchor to one object);

and puts the largest of the first epoch and of all epochs beside the bound, with the loss's forward peak the loss
formula gives at each (``LossModel.terms`` at that foreground). Labels and images only: no step is run::

    python -m benchmarks.dense_scenes.foreground_sampled datasets=DIR data=monuseg/data.yaml model=yolo11n-seg.yaml imgsz=1024
        [epochs=100] [seed=0] out=benchmarks/results/foreground-sampled-monuseg

Run it on a copy of a shared dataset: Ultralytics writes a label cache beside the labels.
"""

from __future__ import annotations

import random
import sys
import time

import numpy as np
import torch
from ultralytics import YOLO
from ultralytics.cfg import get_cfg
from ultralytics.data import build_yolo_dataset
from ultralytics.data.utils import check_det_dataset

from yolo_ckpt.bench.results_io import dataset_yaml, provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.memory import loss_models, model_task
from yolo_ckpt.memory.foreground import candidates
from yolo_ckpt.memory.runspec import count_data

MiB = 2**20
KEYS = ("data", "datasets", "model", "imgsz", "epochs", "seed", "out")  # the key=value words main takes


def sample_counts(assigner, bboxes: torch.Tensor, imgsz: int, strides) -> tuple[int, int]:
    """(candidate pairs, the most foreground any predictions can give) of one sample's ``bboxes`` (n, 4 normalised
    xywh, as the training dataset gives them) for the task-aligned ``assigner`` on the anchor grid of a square
    ``imgsz`` at ``strides``."""
    xywh = bboxes.double() * imgsz
    xyxy = torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1).float()[None]
    in_box = candidates(assigner, xyxy, torch.ones(1, len(xywh), 1), imgsz, strides)[0]
    per_object = in_box.sum(1)
    return int(per_object.sum()), int(min(per_object.clamp(max=assigner.topk).sum(), in_box.any(0).sum()))


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.dense_scenes.foreground_sampled", required=("data",))
    model_cfg, data = opts.get("model", "yolo11n-seg.yaml"), dataset_yaml(opts["data"], opts.get("datasets"))
    imgsz, epochs, seed = int(opts.get("imgsz", 1024)), int(opts.get("epochs", 100)), int(opts.get("seed", 0))
    start = time.perf_counter()
    model = YOLO(model_cfg).model
    task, strides = model_task(model), [float(s) for s in model.stride]
    args = get_cfg(overrides={"task": task, "imgsz": imgsz})
    model.args = args  # what the loss reads (overlap_mask, the gains), as a trainer sets it
    info = check_det_dataset(data)
    counts = count_data(args, info, 32)
    assigner = model.init_criterion().assigner
    topk = assigner.topk
    grid = sum((imgsz // int(s)) ** 2 for s in strides)
    bound_fg, bound_pairs = counts.sizes.per_image(imgsz, strides, topk), counts.sizes.pairs_per_image(imgsz, strides, grid)
    dataset = build_yolo_dataset(args, info["train"], 1, info, mode="train", rect=False, stride=32)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    per_epoch = []  # (most pairs, most foreground, most objects) of each epoch
    for _ in range(epochs):
        rows = [(*sample_counts(assigner, (s := dataset[i])["bboxes"], imgsz, strides), len(s["cls"])) for i in range(len(dataset))]
        per_epoch.append(tuple(int(v) for v in np.max(rows, 0)))
    most = np.max(per_epoch, 0)
    first = per_epoch[0]
    formula = loss_models(model, False)[False] if task == "segment" else None

    def loss_mib(fg: int) -> float | None:  # the stock loss formula's forward peak at this foreground, batch 1
        if formula is None:
            return None
        return float(formula.terms(1, imgsz, counts.planned_objects, (fg, fg)) @ np.array(formula.forward) / MiB)

    result = {
        **provenance(["python -m benchmarks.dense_scenes.foreground_sampled", *argv], seeds=[seed]),
        "model": model_cfg, "data": opts["data"], "task": task, "imgsz": imgsz, "epochs": epochs, "samples": epochs * len(dataset),
        "topk": topk, "planned_objects": counts.planned_objects,
        "bound": {"foreground": bound_fg, "pairs": bound_pairs, "loss_forward_mib": loss_mib(bound_fg)},
        "first_epoch": {"pairs": first[0], "foreground": first[1], "objects": first[2], "loss_forward_mib": loss_mib(first[1])},
        "all_epochs": {
            "pairs": int(most[0]), "foreground": int(most[1]), "objects": int(most[2]), "loss_forward_mib": loss_mib(int(most[1]))
        },
        "per_epoch": per_epoch, "seconds": round(time.perf_counter() - start, 1),
    }
    ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"  # noqa: E731
    lines = [
        f"| {model_cfg} {data} imgsz={imgsz} | objects in one sample | candidate pairs | foreground (any predictions) | "
        "stock loss forward MiB at it |",
        "|---|---|---|---|---|",
        f"| the memory model's bound | {counts.planned_objects} | {bound_pairs} | {bound_fg} | {_mib(loss_mib(bound_fg))} |",
        f"| densest of epoch 1 ({len(dataset)} samples) | {first[2]} | {first[0]} | {first[1]} | {_mib(loss_mib(first[1]))} |",
        f"| densest of {epochs} epochs ({epochs * len(dataset)} samples) | {most[2]} | {most[0]} | {most[1]} | "
        f"{_mib(loss_mib(int(most[1])))} |",
        "",
        f"Bound / densest of {epochs} epochs: pairs {ratio(bound_pairs, most[0])}, foreground {ratio(bound_fg, most[1])}; "
        f"densest of {epochs} epochs / of epoch 1: pairs {ratio(most[0], first[0])}, foreground {ratio(most[1], first[1])}. "
        f"Epochs in which the densest sample so far was drawn: "
        f"{[e + 1 for e in range(epochs) if per_epoch[e][1] == max(p[1] for p in per_epoch[: e + 1])]}.",
        "",
        f"Ultralytics' training pipeline at its default augmentation (mosaic on for every epoch), seed={seed}; per sample "
        "the candidate pairs (select_candidates_in_gts) and the foreground any predictions can give: at most min(topk, "
        "in-box anchors) per object and at most the anchors in some box. The loss forward peak: the stock loss formula "
        "(yolo_ckpt.memory.loss_model.LossModel) at that foreground, batch 1, objects at the plan's bound.",
    ]
    publish(result, lines, opts.get("out"))
    return result


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.dense_scenes.foreground_sampled"))
