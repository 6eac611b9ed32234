"""The densest training batch a segmentation dataset's mosaic can make, measured against the memory model's estimate.

Ultralytics' mosaic puts four images on a 2 x imgsz canvas and its random affine crops an imgsz square at a scale
in ``1 +- scale`` (``scale=0.5`` by default): at 0.5 the square shows the whole canvas, four images at half size with
all their objects. That is why Ultralytics' ``DetectionTrainer.auto_batch`` and the memory model plan for the data's
most objects in one image x 4. This benchmark builds that batch from the dataset's four densest images (each
letterboxed to imgsz / 2 by Ultralytics' dataset, without augmentation, and laid 2 x 2: the mosaic at scale 0.5 less
its random placement), measures one CPU training step of it (:func:`yolo_ckpt.memory.measure.profile_step`, fp32,
``recompute=none``) and puts the estimate beside it, at the batch's own object count and at the planner's bound.

    python -m benchmarks.densest_mosaic data=../shared/datasets/monuseg/data.yaml out=benchmarks/results/densest-mosaic
"""

from __future__ import annotations

import sys

import torch
from ultralytics.cfg import get_cfg
from ultralytics.data import YOLODataset
from ultralytics.data.utils import check_det_dataset

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import key_value
from yolo_ckpt.cli.commands import estimate_setup
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.memory.estimate import estimate_step
from yolo_ckpt.memory.measure import profile_step


def densest_mosaic(data: str, imgsz: int) -> tuple[dict, list[int]]:
    """The batch of one image (``imgsz`` square) made of ``data``'s four densest training images at ``imgsz / 2``,
    as Ultralytics' collate gives a segmentation batch (overlapping masks at a quarter of imgsz, one index per
    object), and the object counts of the four images.

    Raises:
        ValueError: for an imgsz that is not a multiple of 64 (each half must be a multiple of the stride 32).
    """
    if imgsz % 64:
        raise ConfigError(f"imgsz={imgsz}: give a multiple of 64 (each of the four images is imgsz/2 at stride 32)")
    half, quarter = imgsz // 2, imgsz // 8  # an image's side, and its masks' side at mask_ratio 4
    cfg = get_cfg(overrides={"task": "segment", "imgsz": half})
    info = check_det_dataset(data)
    dataset = YOLODataset(img_path=info["train"], imgsz=half, augment=False, hyp=cfg, data=info, task="segment", batch_size=1)
    densest = sorted(range(len(dataset.labels)), key=lambda i: -len(dataset.labels[i]["cls"]))[:4]
    img, masks = torch.zeros(1, 3, imgsz, imgsz), torch.zeros(1, 2 * quarter, 2 * quarter, dtype=torch.int32)
    cls, boxes, counts = [], [], []
    for k, i in enumerate(densest):
        item, (row, col) = dataset[i], divmod(k, 2)
        img[0, :, row * half : (row + 1) * half, col * half : (col + 1) * half] = item["img"].float() / 255
        index = item["masks"][0].to(torch.int32)  # 0 background, j + 1 for the image's object j
        masks[0, row * quarter : (row + 1) * quarter, col * quarter : (col + 1) * quarter] = torch.where(index > 0, index + sum(counts), 0)
        xywh = item["bboxes"].clone()  # normalised to the image: to the 2 x 2 canvas
        xywh[:, 0], xywh[:, 1], xywh[:, 2:] = (xywh[:, 0] + col) / 2, (xywh[:, 1] + row) / 2, xywh[:, 2:] / 2
        boxes.append(xywh)
        cls.append(item["cls"].float())
        counts.append(len(item["cls"]))
    n = sum(counts)
    return {"img": img, "cls": torch.cat(cls), "bboxes": torch.cat(boxes), "batch_idx": torch.zeros(n), "masks": masks}, counts


def main(argv: list[str]) -> dict:
    opts = dict(key_value(a) for a in argv)
    imgsz = int(opts.get("imgsz", 1024))
    batch, counts = densest_mosaic(opts["data"], imgsz)
    # the model and the objects bound as `yolo-ckpt plan` takes them for these keys (the data's classes; its most x 4)
    keys = [f"model={opts.get('model', 'yolo11n-seg.yaml')}", f"data={opts['data']}", f"imgsz={imgsz}", "batch=1", "device=cpu"]
    run, keys_read = estimate_setup(keys)
    model, spec = run.model, run.spec
    measured = profile_step(model, batch, "none", flops=False)
    objects, bound = sum(counts), spec.objects
    # at the bound as plan takes it: the foreground bounded by the data's box sizes (run.sizes), and at the worst size
    estimates = {n: estimate_step(model, imgsz, 1, n, "none", flops=False, sizes=run.sizes).peak_bytes for n in (objects, bound)}
    worst = estimate_step(model, imgsz, 1, bound, "none", flops=False).peak_bytes
    model_cfg = keys_read["model"]
    result = {
        **provenance(" ".join(["python -m benchmarks.densest_mosaic", *argv])),
        "model": model_cfg, "data": opts["data"], "imgsz": imgsz, "batch": 1, "amp": False, "device": "cpu",
        "objects_of_the_four_images": counts, "objects": objects, "objects_bound": bound,
        "measured_peak_bytes": measured.peak_bytes, "measured_loss_bytes": measured.loss_bytes,
        "estimated_peak_bytes_at_objects": estimates[objects], "estimated_peak_bytes_at_bound": estimates[bound],
        "estimated_peak_bytes_at_bound_worst_size": worst,
    }
    mib, peak = 2**20, measured.peak_bytes
    lines = [
        "| model | imgsz | batch | objects (4 densest images) | measured MiB | estimated MiB at its objects | at the bound (objects) "
        "| at the bound, worst box size |",
        "|---|---|---|---|---|---|---|---|",
        f"| {model_cfg} | {imgsz} | 1 | {objects} ({', '.join(map(str, counts))}) | {peak / mib:.0f} | "
        f"{estimates[objects] / mib:.0f} ({estimates[objects] / peak:.2f}x) | "
        f"{estimates[bound] / mib:.0f} ({bound}; {estimates[bound] / peak:.2f}x) | {worst / mib:.0f} ({worst / peak:.2f}x) |",
        "",
        "CPU fp32, recompute=none, one step with AdamW's state (yolo_ckpt.memory.measure.profile_step); the estimates bound "
        "the foreground anchors by the data's box sizes (plan's rule with data=), the last column by objects x topk.",
        "",
        run.spec.describe(),
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
