"""The densest training batch a detection or segmentation dataset's mosaic can make, measured against the memory
model's estimate.

Ultralytics' mosaic puts four images on a 2 x imgsz canvas and its random affine crops an imgsz square at a scale
in ``1 +- scale`` (``scale=0.5`` by default): at 0.5 the square shows the whole canvas, four images at half size with
all their objects. That is why Ultralytics' ``DetectionTrainer.auto_batch`` and the memory model plan for the data's
most objects in one image x 4. This benchmark builds that batch from the dataset's ``4 x batch`` densest images (each
letterboxed to imgsz / 2 by Ultralytics' dataset, without augmentation, four laid 2 x 2 per image: the mosaic at
scale 0.5 less its random placement), measures one CPU training step of it (:func:`yolo_ckpt.memory.step.profile_step`,
fp32, with ``recompute=``) and puts the estimate beside it, at the batch's own object count and at the planner's
bound (what ``yolo-ckpt plan`` and ``train`` estimate for these keys). ``repeat=True`` lays the densest image in all
four places (a mosaic draws its other three images at random, so it may draw that one four times);
``rank=foreground`` takes the densest images by the foreground their boxes can give at imgsz / 2 (any predictions:
:func:`benchmarks.dense_scenes.foreground_sampled.sample_counts`) rather than by their objects (larger objects claim more anchors);
``objects=K`` keeps each image's first K objects (a sparser batch of the same layout: one whose foreground fills one
backward tile of the loss region, the largest, for ``recompute=all``);
``predictions=overlapping`` measures the step as a trained model's predictions make it
(:func:`benchmarks.memory_model.epoch_peaks.overlapping_predictions`)::

    python -m benchmarks.dense_scenes.densest_mosaic datasets=DIR data=monuseg/data.yaml [imgsz=1024] [batch=1] [recompute=none]
        [repeat=True] [rank=foreground] [objects=K] [predictions=overlapping]
        [model=yolo11n-seg.yaml] out=benchmarks/results/densest-mosaic

The task is the model's (``model=yolo11n.yaml`` for a detection set). Run it on a copy of a shared dataset: Ultralytics
writes a label cache beside the labels.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from ultralytics.cfg import get_cfg
from ultralytics.data import YOLODataset
from ultralytics.data.utils import check_det_dataset

from benchmarks.dense_scenes.foreground_sampled import sample_counts
from benchmarks.memory_model.epoch_peaks import predictions_context
from yolo_ckpt.bench.results_io import dataset_yaml, provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.memory import PlannedRun, estimate_step, measured_foreground, model_task, profile_step


def densest_mosaic(data: str, imgsz: int, batch: int = 1, task: str = "segment", repeat: bool = False,
                   rank: Callable[[dict], float] | None = None, objects: int | None = None) -> tuple[dict, list[int]]:
    """The batch of ``batch`` images (``imgsz`` squares), each made of four of ``data``'s ``4 x batch`` densest training
    images at ``imgsz / 2`` (``repeat``: the densest one four times, as a mosaic may draw it), as Ultralytics' collate
    gives a ``task`` (detect, segment) batch (segment: overlapping masks at a quarter of imgsz, one index per object),
    and the object counts of the images used, densest first. Densest: by ``rank`` of the dataset's item at
    ``imgsz / 2`` where given, else by objects. ``objects``: keep each image's first this many objects (None: all).

    Raises:
        ValueError: for an imgsz that is not a multiple of 64 (each half must be a multiple of the stride 32).
    """
    if imgsz % 64:
        raise ConfigError(f"imgsz={imgsz}: give a multiple of 64 (each of the four images is imgsz/2 at stride 32)")
    half, quarter = imgsz // 2, imgsz // 8  # an image's side, and its masks' side at mask_ratio 4
    cfg = get_cfg(overrides={"task": task, "imgsz": half})
    info = check_det_dataset(data)
    dataset = YOLODataset(img_path=info["train"], imgsz=half, augment=False, hyp=cfg, data=info, task=task, batch_size=1)
    score = (lambda i: len(dataset.labels[i]["cls"])) if rank is None else (lambda i: rank(dataset[i]))
    densest = sorted(range(len(dataset.labels)), key=lambda i: -score(i))[: 4 * batch]
    densest = densest[:1] * (4 * batch) if repeat else densest
    img, masks = torch.zeros(batch, 3, imgsz, imgsz), torch.zeros(batch, 2 * quarter, 2 * quarter, dtype=torch.int32)
    cls, boxes, index, counts = [], [], [], []
    kept = slice(0, objects)  # each image's first objects: the overlap mask's index j + 1 is object j's (Format sorts both)
    for k, i in enumerate(densest):
        item, (b, (row, col)) = dataset[i], (k // 4, divmod(k % 4, 2))
        img[b, :, row * half : (row + 1) * half, col * half : (col + 1) * half] = item["img"].float() / 255
        if task == "segment":
            before = sum(counts[4 * b : k])  # objects of this image's earlier quarters
            own = item["masks"][0].to(torch.int32)  # 0 background, j + 1 for the quarter's object j
            shown = (own > 0) & (own <= len(item["cls"][kept]))
            masks[b, row * quarter : (row + 1) * quarter, col * quarter : (col + 1) * quarter] = torch.where(shown, own + before, 0)
        xywh = item["bboxes"][kept].clone()  # normalised to the quarter: to the 2 x 2 canvas
        xywh[:, 0], xywh[:, 1], xywh[:, 2:] = (xywh[:, 0] + col) / 2, (xywh[:, 1] + row) / 2, xywh[:, 2:] / 2
        boxes.append(xywh)
        cls.append(item["cls"][kept].float())
        index.append(torch.full((len(xywh),), float(b)))
        counts.append(len(xywh))
    out = {"img": img, "cls": torch.cat(cls), "bboxes": torch.cat(boxes), "batch_idx": torch.cat(index)}
    return ({**out, "masks": masks} if task == "segment" else out), counts


# the key=value words main takes
KEYS = ("data", "datasets", "model", "imgsz", "batch", "recompute", "repeat", "rank", "objects", "predictions", "out")
RANKS = ("objects", "foreground")  # rank=: what makes an image dense


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.dense_scenes.densest_mosaic", required=("data",))
    measured_in = predictions_context(opts.get("predictions", "initial"))
    by = opts.get("rank", "objects")
    if by not in RANKS:
        raise ConfigError(f"rank={by} is not one of {', '.join(RANKS)}")
    kept = opts.get("objects")
    if kept is not None and not (str(kept).isdigit() and int(kept) > 0):
        raise ConfigError(f"objects={kept}: give a whole number of objects per image, at least 1")
    kept = int(kept) if kept is not None else None
    imgsz, batch_size, recompute = int(opts.get("imgsz", 1024)), int(opts.get("batch", 1)), opts.get("recompute") or "none"
    # the model, the objects bound and the data's box sizes as `yolo-ckpt plan` takes them for these keys
    data = dataset_yaml(opts["data"], opts.get("datasets"))  # read against datasets= (a record names no machine's path)
    keys = {"model": opts.get("model", "yolo11n-seg.yaml"), "data": data, "imgsz": imgsz, "batch": batch_size, "device": "cpu"}
    run = PlannedRun.from_keys(keys)
    model, spec, task = run.model, run.spec, model_task(run.model)
    repeat, predictions = str(opts.get("repeat", False)).lower() == "true", opts.get("predictions", "initial")
    assigner, strides = model.init_criterion().assigner, [float(s) for s in model.stride]
    rank = (lambda item: sample_counts(assigner, item["bboxes"], imgsz // 2, strides)[1]) if by == "foreground" else None
    batch, counts = densest_mosaic(data, imgsz, batch_size, task, repeat, rank, kept)
    with measured_in():
        foreground = measured_foreground(model, batch).sum(0).tolist() if task == "segment" else []
        measured = profile_step(model, batch, recompute, flops=False)
    per_image = [sum(counts[4 * b : 4 * b + 4]) for b in range(batch_size)]
    objects, bound = max(per_image), spec.objects
    memory = run.memory_model()  # the planned run's estimate (at the bound), as plan and train make it
    at_bound = memory.estimate(recompute, batch_size, imgsz).peak_bytes
    at_objects = estimate_step(model, imgsz, batch_size, objects, recompute, flops=False, sizes=run.sizes).peak_bytes
    model_cfg = run.keys["model"]
    result = {
        **provenance(["python -m benchmarks.dense_scenes.densest_mosaic", *argv], seeds=[0]),
        "model": model_cfg, "task": task, "data": opts["data"], "imgsz": imgsz, "batch": batch_size, "recompute": recompute,
        "amp": False, "device": "cpu", "repeat": repeat, "rank": by, "objects_kept": kept, "predictions": predictions,
        "foreground": foreground,
        "objects_of_the_images": counts, "objects_per_image": per_image, "objects_bound": bound,
        "measured_peak_bytes": measured.peak_bytes, "measured_loss_bytes": measured.loss_bytes,
        "estimated_peak_bytes_at_objects": at_objects, "estimated_peak_bytes_at_bound": at_bound,
    }
    mib, peak = 2**20, measured.peak_bytes
    lines = [
        "| model | data | imgsz | batch | recompute | objects per image (densest mosaic) | measured MiB | estimated MiB at its objects "
        "| as planned (objects bound) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {model_cfg} | {opts['data']} | {imgsz} | {batch_size} | {recompute} | {', '.join(map(str, per_image))} | {peak / mib:.0f} | "
        f"{at_objects / mib:.0f} ({at_objects / peak:.2f}x) | {at_bound / mib:.0f} ({bound}; {at_bound / peak:.2f}x) |",
        "",
        "CPU fp32, one step with AdamW's state (yolo_ckpt.memory.step.profile_step); the estimates as plan makes them "
        "for these keys (segmentation: the foreground anchors bounded by the data's box sizes)."
        + (" The densest image four times in each mosaic." if repeat else "")
        + (" Densest: by the foreground the images' boxes can give at imgsz / 2." if by == "foreground" else "")
        + (f" Each image's first {kept} objects kept." if kept is not None else "")
        + (" Predictions that overlap every object (the most foreground: a trained model's)." if predictions == "overlapping" else "")
        + (f" Foreground anchors the assigner gave per image: {', '.join(map(str, foreground))}." if foreground else ""),
        "",
        run.spec.describe(),
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.dense_scenes.densest_mosaic"))
