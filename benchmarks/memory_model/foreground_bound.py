"""What a dataset's box sizes do to the segmentation estimate: the foreground anchors per image at the worst box size
(``objects x topk``) and bounded by the labels' sizes at their largest augmented size (``data=``,
:class:`yolo_ckpt.memory.foreground.ObjectSizes`), and the step's estimate with each, for the run ``plan`` would plan
(``yolo_ckpt.memory.planning.PlannedRun.from_keys``: the data's most objects per image x its augmentation's factors). Estimates
only: no step is measured.

    python -m benchmarks.memory_model.foreground_bound datasets=DIR data=monuseg/data.yaml imgsz=1024 \
        out=benchmarks/results/foreground-bound-monuseg
"""

from __future__ import annotations

import sys

import numpy as np

from yolo_ckpt.bench.results_io import dataset_yaml, provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.memory import PlannedRun, estimate_step, loss_models

MiB = 2**20


KEYS = ("data", "datasets", "model", "imgsz", "batch", "recompute", "out")  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.memory_model.foreground_bound", required=("data",))
    imgsz, batch, recompute = int(opts.get("imgsz", 1024)), int(opts.get("batch", 1)), opts.get("recompute", "none")
    data = dataset_yaml(opts["data"], opts.get("datasets"))  # read against datasets= (a record names no machine's path)
    keys = {"model": opts.get("model", "yolo11n-seg.yaml"), "data": data, "imgsz": imgsz, "batch": batch, "device": "cpu"}
    run = PlannedRun.from_keys(keys)
    words = [f"{k}={v}" for k, v in keys.items()]  # the keys as plan takes them, in the record
    model, spec, sizes = run.model, run.spec, run.sizes
    formula = loss_models(model, spec.amp)[recompute != "none"]
    worst, bounded = formula.foreground(batch, run.imgsz, spec.objects), formula.foreground(batch, run.imgsz, spec.objects, sizes)
    peaks = {
        name: estimate_step(model, run.imgsz, batch, spec.objects, recompute, flops=False, loss_model=formula, sizes=s).peak_bytes
        for name, s in (("worst", None), ("bounded", sizes))
    }
    side = np.sqrt(sizes.w * sizes.h) * run.imgsz if sizes is not None else np.zeros(1)
    result = {
        **provenance(["python -m benchmarks.memory_model.foreground_bound", *argv], seeds=[0]),
        "keys": words, "recompute": recompute, "imgsz": run.imgsz, "objects": spec.objects, "assumed": spec.describe(),
        "median_side_px": float(np.median(side)), "p90_side_px": float(np.percentile(side, 90)),
        "foreground_worst": worst, "foreground_bounded": bounded,
        "estimated_peak_bytes_worst": peaks["worst"], "estimated_peak_bytes_bounded": peaks["bounded"],
    }
    lines = [
        f"{' '.join(words)} recompute={recompute}: {spec.objects} objects per image; labels' boxes at imgsz {run.imgsz} before "
        f"augmentation: median side {result['median_side_px']:.1f} px, 90th percentile {result['p90_side_px']:.1f} px.",
        "",
        "| foreground anchors | batch (Fb) | most in one image (F1) | estimated peak MiB |",
        "|---|---|---|---|",
        f"| worst size (objects x topk, at most the anchors) | {worst[0]} | {worst[1]} | {peaks['worst'] / MiB:.0f} |",
        f"| bounded by the labels' sizes (data=) | {bounded[0]} | {bounded[1]} | {peaks['bounded'] / MiB:.0f} |",
        "",
        spec.describe(),
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.memory_model.foreground_bound"))
