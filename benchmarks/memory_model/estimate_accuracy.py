"""The memory model's estimate against CPU measurements of the same steps, beyond the tests' sizes.

By default YOLO11n-seg and YOLO26n-seg (one class, fp32, ``recompute=none`` or another policy, AdamW), batch 1 and
2, imgsz 256, 384 and 512 (up to 3.2x the loss calibration's largest size) and 20 to 600 grid-laid objects per image
(:func:`yolo_ckpt.memory.synthetic_batch.training_batch`): :func:`yolo_ckpt.memory.estimate.estimate_step` against
:func:`yolo_ckpt.memory.step.profile_step`. The estimate must never fall under the measurement. ``cases=`` gives
other steps instead, each ``model:batch:imgsz:objects`` (a detection or segmentation YAML), e.g. the high-resolution
ones with the attention region.

    python -m benchmarks.memory_model.estimate_accuracy [recompute=none] out=benchmarks/results/estimate-accuracy
    python -m benchmarks.memory_model.estimate_accuracy recompute=all out=benchmarks/results/estimate-accuracy-all  # loss region's formula
    python -m benchmarks.memory_model.estimate_accuracy recompute=all cases=yolo11n.yaml:1:3072:20,yolo12n.yaml:1:2048:20 \
        out=benchmarks/results/estimate-accuracy-high-resolution
"""

from __future__ import annotations

import itertools
import sys

import torch
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel, SegmentationModel, guess_model_task

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import listed, parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.errors import ConfigError
from yolo_ckpt.memory import estimate_step, profile_step, training_batch

MODELS = ("yolo11n-seg.yaml", "yolo26n-seg.yaml")
STEPS = tuple(itertools.product((1, 2), (256, 384, 512), (20, 100, 300, 600)))  # (batch, imgsz, objects per image)


KEYS = ("recompute", "cases", "out")  # the key=value words main takes
MODEL_CLASSES = {"detect": DetectionModel, "segment": SegmentationModel}


def cases(value) -> dict[str, list[tuple[int, int, int]]]:
    """``cases=`` (``model:batch:imgsz:objects`` words, a tuple of them from the key=value parser for several) as
    ``{model: [(batch, imgsz, objects), ...]}``; without it the default models and steps.

    Raises:
        ConfigError: a word that is not a detection or segmentation YAML and three positive integers."""
    if value is None:
        return {cfg: list(STEPS) for cfg in MODELS}
    steps = {}
    for word in listed(value):
        cfg, *numbers = str(word).split(":")
        if len(numbers) != 3 or not all(n.isdigit() and int(n) > 0 for n in numbers) or guess_model_task(cfg) not in MODEL_CLASSES:
            raise ConfigError(f"cases={word!r}: each case is model:batch:imgsz:objects (a detect or segment YAML, three positive integers)")
        steps.setdefault(cfg, []).append(tuple(int(n) for n in numbers))
    return steps


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.memory_model.estimate_accuracy")
    recompute = opts.get("recompute", "none")
    rows = []
    for cfg, steps in cases(opts.get("cases")).items():
        torch.manual_seed(0)
        model = MODEL_CLASSES[guess_model_task(cfg)](cfg, nc=1, verbose=False)
        model.args = get_cfg()
        for batch, imgsz, objects in steps:
            estimated = estimate_step(model, imgsz, batch, objects, recompute, flops=False)
            measured = profile_step(model, training_batch(model, batch, imgsz, objects), recompute, flops=False)
            rows.append({
                "model": cfg, "batch": batch, "imgsz": imgsz, "objects": objects,
                "estimated_peak_bytes": estimated.peak_bytes, "measured_peak_bytes": measured.peak_bytes,
                "measured_loss_share": measured.loss_bytes / measured.peak_bytes,
                "error": estimated.peak_bytes / measured.peak_bytes - 1,
            })
    result = {**provenance(["python -m benchmarks.memory_model.estimate_accuracy", *argv], seeds=[0]), "steps": rows}
    lines = ["| model | batch | imgsz | objects | measured MiB | loss share | estimated MiB | error |", "|---|---|---|---|---|---|---|---|"]
    lines += [
        f"| {r['model']} | {r['batch']} | {r['imgsz']} | {r['objects']} | {r['measured_peak_bytes'] / 2**20:.0f} | "
        f"{r['measured_loss_share']:.2f} | {r['estimated_peak_bytes'] / 2**20:.0f} | {r['error']:+.1%} |"
        for r in rows
    ]
    for cfg in dict.fromkeys(r["model"] for r in rows):
        errors = [r["error"] for r in rows if r["model"] == cfg]
        lines.append(f"\n{cfg}: {min(errors):+.1%} to {max(errors):+.1%} over {len(errors)} steps")
    lines.append(f"\nCPU fp32, recompute={recompute}, one class; error = estimate / measurement - 1.")
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.memory_model.estimate_accuracy"))
