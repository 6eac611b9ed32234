"""The chunked assigner on a dense detection step: peak and step time of ``recompute=all`` with the stock assigner
against ``all`` with the chunked one (the loss region, ``yolo_ckpt.checkpointing.assigner``), yolo11n at imgsz 1024, batch 1, 600
objects of 8-28 px (issue 21's dense case), one CPU thread::

    python -m benchmarks.dense_assigner out=benchmarks/results/dense [objects=600] [imgsz=1024] [steps=5]

Peak: live-tensor bytes of one training step (:func:`yolo_ckpt.memory.measure.profile_step`: forward, loss, backward,
AdamW step). Time: forward, loss and backward, median over ``steps`` interleaved pairs (stock assigner, chunked), so
that a shared machine's load slows both alike. The assignments are checked equal (every output, ``torch.equal``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from ultralytics import YOLO
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt import apply_checkpointing, count_recomputations
from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.checkpointing.losses import remove_loss_region
from yolo_ckpt.cli.args import key_value
from yolo_ckpt.memory.measure import profile_step


def dense_batch(imgsz: int, objects: int, seed: int = 0) -> dict:
    """One image of ``imgsz`` px with ``objects`` boxes of 8-28 px side at uniform random places (they may overlap),
    class 0, as Ultralytics' collate gives a detection batch (normalised xywh)."""
    g = torch.Generator().manual_seed(seed)
    wh = (8 + 20 * torch.rand(objects, 2, generator=g)) / imgsz
    centre = wh / 2 + (1 - wh) * torch.rand(objects, 2, generator=g)
    return {
        "img": torch.rand(1, 3, imgsz, imgsz, generator=g),
        "batch_idx": torch.zeros(objects),
        "cls": torch.zeros(objects, 1),
        "bboxes": torch.cat([centre, wh], 1),
    }


def step_seconds(model, batch: dict) -> float:
    """Seconds of forward, loss and backward of ``model`` on ``batch`` (gradients cleared after)."""
    t = time.perf_counter()
    loss, _ = model.loss(batch, model(batch["img"]))
    loss.sum().backward()
    seconds = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    return seconds


def main(argv: list[str]) -> dict:
    opts = dict(key_value(a) for a in argv)
    imgsz, objects, steps = int(opts.get("imgsz", 1024)), int(opts.get("objects", 600)), int(opts.get("steps", 5))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    models = {}
    for name in ("stock assigner", "chunked assigner"):
        model = YOLO("yolo11n.yaml").model.train()
        model.args = DEFAULT_CFG
        apply_checkpointing(model, "all")
        if name == "stock assigner":
            remove_loss_region(model)  # detect's loss region is its assigner only: the layers stay recomputed
        models[name] = model
    batch = dense_batch(imgsz, objects)
    peaks, counts = {}, {}
    for name, model in models.items():
        with count_recomputations() as counter:
            peaks[name] = profile_step(model, batch, None, flops=False).peak_bytes
        counts[name] = counter.assignments
    with torch.no_grad():  # the same assignment: every output of the two criteria's assigners
        preds = models["stock assigner"](batch["img"])
        criteria = {name: model.init_criterion() for name, model in models.items()}
        outputs = {}
        for name, criterion in criteria.items():
            seen = []
            hook = criterion.assigner.register_forward_hook(lambda m, i, o: seen.append(o))  # noqa: B023
            criterion(preds, batch)
            hook.remove()
            outputs[name] = seen[0]
    equal = all(torch.equal(a, b) for a, b in zip(*outputs.values()))
    times = {name: [] for name in models}
    for _ in range(steps):
        for name, model in models.items():
            times[name].append(step_seconds(model, batch))
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        **provenance(" ".join(["python -m benchmarks.dense_assigner", *argv])),
        "load_average_1_5_15min": os.getloadavg(),
        "model": "yolo11n.yaml", "imgsz": imgsz, "batch": 1, "objects_per_image": objects, "object_px": [8, 28],
        "recompute": "all", "peak_bytes": peaks, "chunked_assignments_in_probe": counts, "assignment_equal": equal,
        "step_seconds": times, "step_seconds_median": median,
        "time_ratio_chunked_vs_stock": median["chunked assigner"] / median["stock assigner"],
    }
    lines = [
        f"yolo11n detect, imgsz {imgsz}, batch 1, {objects} objects of 8-28 px, recompute=all, 1 CPU thread:",
        "",
        f"| assigner | peak MiB | step s (median of {steps}) |",
        "|---|---|---|",
        *(f"| {name} | {peaks[name] / 2**20:.0f} | {median[name]:.2f} |" for name in models),
        "",
        f"peak chunked / stock: {peaks['chunked assigner'] / peaks['stock assigner']:.2f}x; time ratio: "
        f"{result['time_ratio_chunked_vs_stock']:.3f}x; assignments equal: {equal}; chunked assignments counted in "
        f"the probe: {counts['chunked assigner']} (stock: {counts['stock assigner']})",
        f"Load average (1, 5, 15 min) at the end: {', '.join(f'{v:.2f}' for v in result['load_average_1_5_15min'])} "
        f"on {os.cpu_count()} cores",
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
