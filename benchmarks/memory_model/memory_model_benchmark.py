"""How fast and how good the memory model's estimates and plans are (issue: memory model).

For each model at imgsz/batch: the estimated peak for none/backbone/all/auto, the seconds an estimate and a plan
take on this machine, and the recompute cost of the auto plan against the cheapest named policy that fits the
same budget (a budget halfway between the 'all' and 'none' estimates). Then the timing targets (:data:`TIMING_TARGETS`):
a plan for yolo11x at imgsz 2048 batch 16, and for yolov9e-seg at imgsz 1280 batch 1 with 800 objects per image.

    python -m benchmarks.memory_model.memory_model_benchmark out=benchmarks/results/memory-model
"""

from __future__ import annotations

import os
import sys
import time

import torch
from ultralytics import YOLO
from ultralytics.nn.tasks import BaseModel
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.config import Budget
from yolo_ckpt.memory import MemoryModel, calibrate_loss, estimate_step


def build(cfg: str) -> BaseModel:
    torch.manual_seed(0)
    model = YOLO(cfg, verbose=False).model  # the task's model class, as Ultralytics picks it
    model.args = DEFAULT_CFG
    return model


def case(cfg: str, imgsz: int, batch: int, objects: int = 20) -> dict:
    model = build(cfg)
    t = time.perf_counter()
    calibrate_loss(model)
    calibration_s = time.perf_counter() - t
    t = time.perf_counter()
    peaks = {p: estimate_step(model, imgsz, batch, objects, p, flops=False).peak_bytes for p in ("none", "backbone", "all")}
    estimate_s = (time.perf_counter() - t) / 3
    budget = (peaks["all"] + peaks["none"]) // 2
    t = time.perf_counter()
    memory = MemoryModel(model, imgsz, batch, objects)
    plan = memory.plan(budget, batch, imgsz)
    plan_s = time.perf_counter() - t
    named = {p: memory.flops_of(p) for p in ("backbone", "all") if peaks[p] <= budget}
    best_named = min(named, key=named.get) if named else None
    return {
        "model": cfg,
        "imgsz": imgsz,
        "batch": batch,
        "objects_per_image": objects,
        "estimated_peak_bytes": {**peaks, "auto": plan.estimated_peak_bytes},
        "budget_bytes": budget,
        "auto_layers": list(plan.indices),
        "auto_recompute_gflops": plan.recompute_flops / 1e9,
        "best_named_fitting": best_named,
        "best_named_recompute_gflops": named[best_named] / 1e9 if best_named else None,
        "auto_costs_no_more": best_named is None or plan.recompute_flops <= named[best_named],
        "loss_calibration_s": calibration_s,
        "estimate_s": estimate_s,
        "plan_s": plan_s,
    }


# (YAML, imgsz, batch, objects per image, budget, target seconds) of the planning-time targets: yolo11x, where every
# layer's figures are many; yolov9e-seg with 800 objects (ultralytics#20853's user, out of memory on 24 GB), where
# the loss formula is calibrated twice (the stock loss and the loss region).
TIMING_TARGETS = (("yolo11x.yaml", 2048, 16, 20, "128GiB", 15), ("yolov9e-seg.yaml", 1280, 1, 800, "24GB", 30))


def timed_plan(cfg: str, imgsz: int, batch: int, objects: int, budget: str, target_s: float) -> dict:
    """Seconds from a fresh model to its plan (loss calibration, the none estimate, the plan and its check)."""
    model = build(cfg)
    t = time.perf_counter()
    plan = MemoryModel(model, imgsz, batch, objects).plan(Budget.parse(budget).bytes(None), batch, imgsz)
    return {
        "model": cfg,
        "imgsz": imgsz,
        "batch": batch,
        "objects_per_image": objects,
        "budget": budget,
        "recompute": plan.recompute,
        "estimated_peak_bytes": plan.estimated_peak_bytes,
        "plan_s": time.perf_counter() - t,
        "target_s": target_s,
    }


KEYS = ("out",)  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.memory_model.memory_model_benchmark")
    cases = [case("yolo11n.yaml", 1536, 8), case("yolo11s.yaml", 1536, 8)]
    targets = [timed_plan(*t) for t in TIMING_TARGETS]
    result = {
        **provenance(["python -m benchmarks.memory_model.memory_model_benchmark", *argv], seeds=[0]),
        "load_average_1_5_15min": os.getloadavg(),  # the machine is shared: the seconds depend on it
        "cases": cases,
        "plan_timing_targets": targets,
    }
    lines = [
        "| model | imgsz | batch | none GiB | backbone GiB | all GiB | auto GiB (budget) | auto GFLOPs | best named fitting | "
        "estimate s | plan s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        p = {k: v / 2**30 for k, v in c["estimated_peak_bytes"].items()}
        named = f"{c['best_named_fitting']} ({c['best_named_recompute_gflops']:.1f} GFLOPs)" if c["best_named_fitting"] else "none fits"
        lines.append(
            f"| {c['model']} | {c['imgsz']} | {c['batch']} | {p['none']:.2f} | {p['backbone']:.2f} | {p['all']:.2f} | "
            f"{p['auto']:.2f} ({c['budget_bytes'] / 2**30:.2f}) | {c['auto_recompute_gflops']:.1f} | {named} | "
            f"{c['estimate_s']:.1f} | {c['plan_s']:.1f} |"
        )
    lines.append("")
    for t in targets:
        lines.append(
            f"Plan for {t['model']} imgsz {t['imgsz']} batch {t['batch']}, {t['objects_per_image']} objects (budget {t['budget']}): "
            f"{t['plan_s']:.1f} s (target < {t['target_s']} s), recompute={t['recompute']}"
        )
    lines.append(
        f"Load average (1, 5, 15 min) at the end: {', '.join(f'{v:.2f}' for v in result['load_average_1_5_15min'])} on "
        f"{os.cpu_count()} cores"
    )
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.memory_model.memory_model_benchmark"))
