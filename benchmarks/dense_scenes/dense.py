"""Issue 21's ``dense`` matrix: dense scenes' training steps with the loss region (the chunked assigner and, for
segmentation, the recomputed mask loss) against stock, one CPU thread::

    python -m benchmarks.dense_scenes.dense out=benchmarks/results/dense [steps=5] [cases=detect-600,seg-400]

Cases: yolo11n detect at imgsz 1024, batch 1, with 20, 200, 600 and 1500 objects of 8-28 px; yolo11n-obb at 1024,
batch 1, 600 objects of 8-28 px; yolo26n-seg at 640, batch 2, 400 objects of 1-3 % of the side (the small-object
segmentation of the issue). Objects as :func:`yolo_ckpt.memory.synthetic_batch.training_batch` lays them (one per cell of a
grid, each side drawn in the range: where a box is larger than its cell, neighbours overlap).

Per case:

- peak bytes of one training step (:func:`yolo_ckpt.memory.step.profile_step`: forward, loss, backward, AdamW step,
  the optimizer's state included) for ``recompute=none`` (stock), ``all`` and ``auto`` at half of ``none``'s
  estimate (``memory_budget=0.5x``, planned by :class:`yolo_ckpt.memory.memory_model.MemoryModel` from the case's objects
  and their boxes, as ``data=`` states them: :meth:`~yolo_ckpt.memory.foreground.ObjectSizes.of_batch`; without them
  the estimate takes every box as the whole image, issue 30), with the estimates beside them;
- the gradients and the weights after one AdamW step of ``all`` against stock: ``torch.equal`` on every tensor;
- step time (forward, loss, backward) of ``recompute=loss`` against the same policy with the stock assigner
  (detect and obb: their loss region is the assigner, so that is ``none``), median over ``steps`` interleaved pairs,
  so that a shared machine's load slows both alike.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time

import torch
from ultralytics import YOLO
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt import apply_checkpointing, count_recomputations
from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.checkpointing.assigner import chunk_assigners
from yolo_ckpt.cli.args import listed, parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.memory import MemoryModel, ObjectSizes, build_optimizer, model_task, profile_step, training_batch

SMALL = (8 / 1024, 28 / 1024)  # 8-28 px at 1024
CASES = {
    **{f"detect-{n}": ("yolo11n.yaml", 1024, 1, n, SMALL) for n in (20, 200, 600, 1500)},
    "obb-600": ("yolo11n-obb.yaml", 1024, 1, 600, SMALL),
    "seg-400": ("yolo26n-seg.yaml", 640, 2, 400, (0.01, 0.03)),
}
BUDGET_FRACTION = 0.5


def _model(name: str):
    torch.manual_seed(0)
    model = YOLO(name).model.train()
    model.args = DEFAULT_CFG
    return model


def _step_seconds(model, batch: dict) -> float:
    """Seconds of forward, loss and backward of ``model`` on ``batch`` (gradients cleared after)."""
    t = time.perf_counter()
    loss, _ = model.loss(batch, model(batch["img"]))
    loss.sum().backward()
    seconds = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    return seconds


def _trained(model, policy: str, batch: dict):
    """A copy of ``model`` with ``policy`` applied after one step (forward, loss, backward, AdamW step), and its
    gradients."""
    model = copy.deepcopy(model)
    apply_checkpointing(model, policy)
    optimizer = build_optimizer(model, "AdamW")
    loss, _ = model.loss(batch, model(batch["img"]))
    loss.sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]  # not the DFL's fixed weights
    optimizer.step()
    return model, grads


def case(name: str, steps: int) -> dict:
    """One case's row (module docstring)."""
    model_name, imgsz, batch_size, objects, sides = CASES[name]
    model = _model(model_name)
    batch = training_batch(model, batch_size, imgsz, objects, sides=sides)
    memory = MemoryModel(model, imgsz, batch_size, objects, sizes=ObjectSizes.of_batch(batch, model_task(model)))
    budget = int(BUDGET_FRACTION * memory.peak((), batch_size, imgsz))
    plan = memory.plan(budget, batch_size, imgsz)
    row = {"case": name, "model": model_name, "imgsz": imgsz, "batch": batch_size, "objects": objects,
           "object_sides": sides, "budget_bytes": budget, "auto": plan.recompute, "peak_bytes": {}, "estimated_bytes": {},
           "recomputed": {}, "assignments": {}}
    for policy, spec in (("none", "none"), ("all", "all"), ("auto", plan.recompute)):
        with count_recomputations() as counter:
            row["peak_bytes"][policy] = profile_step(model, batch, spec, flops=False).peak_bytes
        row["recomputed"][policy], row["assignments"][policy] = counter.total, counter.assignments
        row["estimated_bytes"][policy] = memory.estimate(spec, batch_size, imgsz).peak_bytes
    stock, stock_grads = _trained(model, "none", batch)
    ckpt, ckpt_grads = _trained(model, "all", batch)
    row["grads_equal"] = all(torch.equal(a, b) for a, b in zip(stock_grads, ckpt_grads))
    row["weights_equal"] = all(torch.equal(a, b) for a, b in zip(stock.state_dict().values(), ckpt.state_dict().values()))
    timed = {"stock assigner": copy.deepcopy(model), "chunked assigner": copy.deepcopy(model)}
    for variant, m in timed.items():
        apply_checkpointing(m, "loss")
        m.criterion = m.init_criterion()
        if variant == "stock assigner":
            chunk_assigners(m.criterion, None)  # the same policy (a segmentation mask loss stays recomputed)
    times = {variant: [] for variant in timed}
    for _ in range(steps):
        for variant, m in timed.items():
            times[variant].append(_step_seconds(m, batch))
    row["step_seconds"] = times
    row["step_seconds_median"] = {variant: statistics.median(t) for variant, t in times.items()}
    row["time_ratio"] = row["step_seconds_median"]["chunked assigner"] / row["step_seconds_median"]["stock assigner"]
    return row


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f}"


KEYS = ("steps", "cases", "out")  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.dense_scenes.dense")
    steps = int(opts.get("steps", 5))
    names = listed(opts["cases"]) if "cases" in opts else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"cases={','.join(unknown)}: not a case; valid: {', '.join(CASES)}")
    torch.set_num_threads(1)
    rows = []
    for name in names:
        rows.append(case(name, steps))
        print(rows[-1], flush=True)
    result = {
        **provenance(["python -m benchmarks.dense_scenes.dense", *argv], seeds=[0]),
        "load_average_1_5_15min": os.getloadavg(),
        "torch_threads": 1,
        "rows": rows,
    }
    lines = [
        "Dense scenes, one CPU thread: peak bytes of one training step (AdamW's state included), measured and estimated",
        "(the batch's boxes stated, as data= gives them);",
        f"`auto` planned for {BUDGET_FRACTION}x of `none`'s estimate; `all` against stock after one AdamW step; step time",
        f"(forward, loss, backward) of `recompute=loss` with the chunked against the stock assigner, median of {steps} pairs.",
        "",
        "| case | model | imgsz | batch | objects | none MiB (est.) | all MiB (est.) | all / none | auto | auto MiB (est.) | "
        "budget MiB | grads, weights equal | loss time chunked / stock |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak, est = r["peak_bytes"], r["estimated_bytes"]
        lines.append(
            f"| {r['case']} | {r['model']} | {r['imgsz']} | {r['batch']} | {r['objects']} | {_mib(peak['none'])} ({_mib(est['none'])}) | "
            f"{_mib(peak['all'])} ({_mib(est['all'])}) | {peak['all'] / peak['none']:.2f}x | {r['auto']} | "
            f"{_mib(peak['auto'])} ({_mib(est['auto'])}) | {_mib(r['budget_bytes'])} | {r['grads_equal']}, {r['weights_equal']} | "
            f"{r['time_ratio']:.3f}x ({r['step_seconds_median']['chunked assigner']:.2f} / "
            f"{r['step_seconds_median']['stock assigner']:.2f} s) |"
        )
    lines += [
        "",
        f"Load average (1, 5, 15 min) at the end: {', '.join(f'{v:.2f}' for v in result['load_average_1_5_15min'])} "
        f"on {os.cpu_count()} cores",
    ]
    publish(result, lines, opts.get("out"))
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.dense_scenes.dense"))
