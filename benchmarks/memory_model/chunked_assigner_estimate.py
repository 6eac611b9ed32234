"""The loss formula of the chunked assigner (``recompute=loss``) against CPU measurements on a dense detection step.

The chunked assigner (:mod:`yolo_ckpt.checkpointing.assigner`) holds one image's chunk of ``assign_chunk`` objects x
anchors at a time, so its loss peak stops growing with the objects past one chunk; the formula's term for it is
``A * min(M, assign_chunk)`` (:class:`yolo_ckpt.memory.loss_model.LossModel`). yolo11n detect, 1024 px, batch 1, 20, 600
and 1500 objects of 8-28 px, ``recompute=all`` (one class, fp32): the measured step
(:func:`yolo_ckpt.memory.profile_step`) and the estimate given the batch's box sizes (as ``plan`` bounds them from
``data=``; without them the estimate takes every box as the whole image), the loss's own peak and the step's.

    python -m benchmarks.memory_model.chunked_assigner_estimate out=benchmarks/results/chunked-assigner-estimate
"""

from __future__ import annotations

import sys

import torch
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.memory import ObjectSizes, estimate_step, profile_step, training_batch

MiB = 2**20


KEYS = ("imgsz", "recompute", "out")  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.memory_model.chunked_assigner_estimate")
    imgsz, recompute = int(opts.get("imgsz", 1024)), opts.get("recompute", "all")
    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=1, verbose=False)
    model.args = get_cfg()
    rows = []
    for objects in (20, 600, 1500):
        batch = training_batch(model, 1, imgsz, objects, sides=(8 / 1024, 28 / 1024))
        measured = profile_step(model, batch, recompute, flops=False)
        # the batch's boxes as they are (sizes, not places: ObjectSizes.of_batch), as plan bounds them from data=
        estimated = estimate_step(model, imgsz, 1, objects, recompute, flops=False, sizes=ObjectSizes.of_batch(batch, "detect"))
        rows.append({
            "objects": objects, "measured_loss_bytes": measured.loss_bytes, "estimated_loss_bytes": estimated.loss_bytes,
            "measured_peak_bytes": measured.peak_bytes, "estimated_peak_bytes": estimated.peak_bytes,
            "measured_loss_phase_bytes": measured.phase_peak_bytes["loss"],
            "estimated_loss_phase_bytes": estimated.phase_peak_bytes["loss"],
        })
    result = {
        **provenance(["python -m benchmarks.memory_model.chunked_assigner_estimate", *argv], seeds=[0]),
        "imgsz": imgsz, "batch": 1, "recompute": recompute, "rows": rows,
    }
    lines = [
        f"yolo11n detect, imgsz {imgsz}, batch 1, objects of 8-28 px, recompute={recompute}, one class, CPU fp32.",
        "",
        "| objects | loss peak MiB measured | estimated | loss phase MiB measured | estimated | step peak MiB measured | estimated |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['objects']} | {r['measured_loss_bytes'] / MiB:.1f} | {r['estimated_loss_bytes'] / MiB:.1f} "
        f"({r['estimated_loss_bytes'] / r['measured_loss_bytes'] - 1:+.0%}) | {r['measured_loss_phase_bytes'] / MiB:.0f} | "
        f"{r['estimated_loss_phase_bytes'] / MiB:.0f} | {r['measured_peak_bytes'] / MiB:.0f} | {r['estimated_peak_bytes'] / MiB:.0f} "
        f"({r['estimated_peak_bytes'] / r['measured_peak_bytes'] - 1:+.1%}) |"
        for r in rows
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.memory_model.chunked_assigner_estimate"))
