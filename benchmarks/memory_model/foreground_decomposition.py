"""Where a segmentation estimate's over-estimate on small objects comes from: the loss formula term by term, with the
foreground anchors it assumes against those the assigner really gives.

The loss formula (:class:`yolo_ckpt.memory.loss_model.LossModel`) takes the foreground anchors' bound, ``min(objects *
topk, anchors)`` per image and assigner; an object smaller than the anchor grid holds fewer anchors in its box than
``topk`` and the assigner can only pick among those (``select_candidates_in_gts``, ``ultralytics/utils/tal.py``). For one
step (default: the issue's yolo11n-seg, 640 px, batch 2, 400 objects per image of 1-3% of the image side, one class,
fp32, ``recompute=none``) this measures the step on the CPU (:func:`yolo_ckpt.memory.step.profile_step`) and the
assigner's foreground (:func:`yolo_ckpt.memory.foreground.measured_foreground`), and lists each term of the loss's
forward and backward peaks at three foregrounds: the worst-size bound the formula assumed before, the bound by the
boxes' sizes (:class:`yolo_ckpt.memory.foreground.ObjectSizes`, what ``data=`` gives the estimate now) and the one
measured, and the step's estimate with each. With
``recompute=all`` (or ``loss``) the loss formula is the loss region's (:func:`yolo_ckpt.memory.loss_calibration.loss_models`).

    python -m benchmarks.memory_model.foreground_decomposition out=benchmarks/results/foreground-decomposition
    python -m benchmarks.memory_model.foreground_decomposition recompute=all out=benchmarks/results/foreground-decomposition-all
"""

from __future__ import annotations

import dataclasses
import sys

import torch
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import SegmentationModel

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import listed, parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.memory import LossModel, ObjectSizes, estimate_step, loss_models, measured_foreground, profile_step, training_batch

MiB = 2**20


class MeasuredForeground(LossModel):
    """A loss formula that takes a given foreground (the measured one) instead of its bound."""

    def __init__(self, fitted: LossModel, foreground: tuple[int, int]):
        super().__init__(**dataclasses.asdict(fitted))
        object.__setattr__(self, "measured", foreground)

    def foreground(self, batch, imgsz, objects, sizes=None):
        return self.measured


VARIANTS = {"assumed": "worst size (objects x topk)", "bounded": "bound by the boxes' sizes", "measured": "the assigner's"}


KEYS = ("model", "imgsz", "batch", "objects", "sides", "recompute", "out")  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.memory_model.foreground_decomposition")
    cfg, imgsz, batch, objects = opts.get("model", "yolo11n-seg.yaml"), int(opts.get("imgsz", 640)), int(opts.get("batch", 2)), int(
        opts.get("objects", 400)
    )
    sides = tuple(float(s) for s in listed(opts.get("sides", "0.01,0.03")))
    recompute = opts.get("recompute", "none")
    torch.manual_seed(0)
    model = SegmentationModel(cfg, nc=1, verbose=False)
    model.args = get_cfg()
    data = training_batch(model, batch, imgsz, objects, sides=sides)
    measured = profile_step(model, data, recompute, flops=False)
    per_image = measured_foreground(model, data)  # (assigners, images)
    fitted = loss_models(model, False)[recompute != "none"]  # the stock loss's formula, or the loss region's
    sizes = ObjectSizes.of_batch(data, "segment")  # the batch's boxes as they are: no augmentation to come
    formulas = {
        "assumed": fitted,
        "bounded": MeasuredForeground(fitted, fitted.foreground(batch, imgsz, objects, sizes)),
        "measured": MeasuredForeground(fitted, (int(per_image.sum()), int(per_image.max()))),
    }
    foreground = {k: f.foreground(batch, imgsz, objects) for k, f in formulas.items()}
    estimates = {k: estimate_step(model, imgsz, batch, objects, recompute, flops=False, loss_model=f) for k, f in formulas.items()}
    terms = {k: f.terms(batch, imgsz, objects) for k, f in formulas.items()}
    rows = [
        {
            "term": name,
            **{f"value_{k}": float(t[i]) for k, t in terms.items()},
            **{f"forward_bytes_{k}": float(t[i] * fitted.forward[i]) for k, t in terms.items()},
            **{f"backward_bytes_{k}": float(t[i] * fitted.backward[i]) for k, t in terms.items()},
        }
        for i, name in enumerate(fitted.term_names())
    ]
    result = {
        **provenance(["python -m benchmarks.memory_model.foreground_decomposition", *argv], seeds=[0]),
        "model": cfg, "imgsz": imgsz, "batch": batch, "objects": objects, "sides": sides, "recompute": recompute,
        **{f"foreground_{k}": v for k, v in foreground.items()}, "foreground_per_image": per_image.tolist(),
        "measured_peak_bytes": measured.peak_bytes, "measured_loss_bytes": measured.loss_bytes,
        "measured_phase_peak_bytes": measured.phase_peak_bytes,
        **{f"estimated_peak_bytes_{k}": e.peak_bytes for k, e in estimates.items()},
        **{f"estimated_phase_peak_bytes_{k}": e.phase_peak_bytes for k, e in estimates.items()},
        "terms": rows,
    }
    peak, phases = measured.peak_bytes, ("forward", "loss", "backward", "optimizer")
    lines = [
        f"{cfg}, imgsz {imgsz}, batch {batch}, {objects} objects per image of {sides[0]:.0%}-{sides[1]:.0%} of the side, "
        f"one class, CPU fp32, recompute={recompute}.",
        "",
        "Foreground anchors (Fb: the batch's over the assigners; F1: the most one assigner gives one image), topk "
        f"{fitted.topk}: " + "; ".join(f"{VARIANTS[k]} {v[0]}, {v[1]}" for k, v in foreground.items())
        + f" (the assigner's, at this model's initial predictions: {foreground['measured'][0] / foreground['assumed'][0]:.2f}x"
        " the worst size).",
        "",
        "| | peak MiB | vs measured | forward | loss | backward | optimizer |",
        "|---|---|---|---|---|---|---|",
        f"| measured step | {peak / MiB:.0f} | 1.00x | " + " | ".join(f"{measured.phase_peak_bytes[p] / MiB:.0f}" for p in phases) + " |",
    ]
    lines += [
        f"| estimate, foreground {VARIANTS[k]} | {e.peak_bytes / MiB:.0f} | {e.peak_bytes / peak:.2f}x | "
        + " | ".join(f"{e.phase_peak_bytes[p] / MiB:.0f}" for p in phases) + " |"
        for k, e in estimates.items()
    ]
    lines += [
        "",
        "The loss formula's terms (bytes = term x fitted coefficient, MiB), forward and backward, per foreground:",
        "",
        "| term | " + " | ".join(f"value {k}" for k in formulas) + " | " + " | ".join(f"forward {k}" for k in formulas) + " | "
        + " | ".join(f"backward {k}" for k in formulas) + " |",
        "|---|" + "---|" * 9,
    ]
    lines += [
        f"| {r['term']} | " + " | ".join(f"{r[f'value_{k}']:.0f}" for k in formulas) + " | "
        + " | ".join(f"{r[f'forward_bytes_{k}'] / MiB:.1f}" for k in formulas) + " | "
        + " | ".join(f"{r[f'backward_bytes_{k}'] / MiB:.1f}" for k in formulas) + " |"
        for r in rows
    ]
    drop = {r["term"]: r["backward_bytes_assumed"] - r["backward_bytes_measured"] for r in rows}
    biggest = max(drop, key=drop.get)
    lines += [
        "",
        f"The term whose assumed foreground adds most to the backward peak: {biggest} ({drop[biggest] / MiB:.0f} MiB of the "
        f"{(estimates['assumed'].peak_bytes - peak) / MiB:.0f} MiB over the measured peak). Measured loss share of the peak: "
        f"{measured.loss_bytes / peak:.2f}. The assigner's foreground depends on the predictions (an untrained model's "
        "boxes overlap few objects, so it gives fewer than the boxes hold): the bound is what a trained model can reach.",
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.memory_model.foreground_decomposition"))
