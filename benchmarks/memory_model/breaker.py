"""Issue 30's breaker suite: the memory model on box layouts it was not fitted on, one CPU thread::

    python -m benchmarks.memory_model.breaker out=benchmarks/results/breaker [cases=detect-large,obb-nested] [imgsz=512] [batch=2]
    python -m benchmarks.memory_model.breaker render=benchmarks/results/breaker/record.json out=benchmarks/results/breaker  # tables again

Layouts (``objects`` boxes per image, normalised xywh, the same layout in every image of the batch): ``grid`` (one
box per cell, as :func:`yolo_ckpt.memory.synthetic_batch.training_batch` lays them and the calibration measures), ``small``
(1-3 % of the side, anywhere), ``large`` (sides 30-90 % of the side, anywhere: they overlap), ``mixed`` (half small,
half 40-90 %), ``nested`` (a crowd: boxes about one point from 5 % of the side to the whole image), ``identical``
(every box the same half-image box) and ``edge`` (centres on the image's edges, sides 10-40 %). Models: yolo11n
(detect), yolo11n-obb, yolo11n-pose, yolo11n-seg and yolo26n (YOLO26's end-to-end loss).

Per case, CPU live-tensor peaks of one training step (:func:`yolo_ckpt.memory.step.profile_step`: forward, loss,
backward, AdamW step, the optimizer's state included) against the memory model's estimate with the layout stated
(``sizes`` of the batch's boxes: what ``data=`` gives a plan), for ``none``, the default (``backbone,loss``), ``all``
and ``recompute=auto`` at 0.5x and 0.7x of ``none``'s measured peak (the plan's policy measured against the budget);
``none`` also against the estimate without a layout (every box the whole image: what ``profile``/``plan`` assume
without ``data=`` or ``object_size=``). ``batch=-1`` once per model, on the ``large`` layout: the largest batch the
default policy fits in 1.5x of ``none``'s measured peak at the case's batch, measured there against that budget.
Summary as estimator papers report it: the median relative error and the share of rows under.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch
from ultralytics import YOLO
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt import count_recomputations
from yolo_ckpt.bench.results_io import provenance, publish
from yolo_ckpt.cli.args import listed, parse_keys
from yolo_ckpt.cli.main import run_command
from yolo_ckpt.memory import MemoryModel, ObjectSizes, PlanError, model_task, profile_step, training_batch

MODELS = {
    "detect": "yolo11n.yaml", "obb": "yolo11n-obb.yaml", "pose": "yolo11n-pose.yaml", "seg": "yolo11n-seg.yaml", "yolo26": "yolo26n.yaml"
}
OBJECTS = {"grid": 60, "small": 200, "large": 60, "mixed": 100, "nested": 40, "identical": 40, "edge": 60}
POLICIES = ("none", "backbone,loss", "all")
AUTO_FRACTIONS = (0.5, 0.7)
BATCH_BUDGET = 1.5  # batch=-1's budget: this many times none's measured peak at the case's batch


def layout(name: str, objects: int, g: torch.Generator) -> torch.Tensor | None:
    """One image's ``objects`` boxes (objects, 4) of layout ``name`` (module docstring), normalised xywh; None: the grid."""

    def rand(*shape):
        return torch.rand(*shape, generator=g)

    def anywhere(lo, hi, n=objects):
        wh = rand(n, 2) * (hi - lo) + lo
        return torch.cat([wh / 2 + rand(n, 2) * (1 - wh), wh], 1)

    if name == "grid":
        return None
    if name == "small":
        return anywhere(0.01, 0.03)
    if name == "large":
        return anywhere(0.3, 0.9)
    if name == "mixed":
        return torch.cat([anywhere(0.01, 0.03, objects // 2), anywhere(0.4, 0.9, objects - objects // 2)])
    if name == "nested":
        side = torch.linspace(0.05, 1.0, objects)[:, None].expand(-1, 2)
        return torch.cat([0.5 + (rand(objects, 2) - 0.5) * (1 - side) * 0.2, side], 1)
    if name == "identical":
        return torch.tensor([[0.5, 0.5, 0.5, 0.5]]).expand(objects, -1).clone()
    if name == "edge":
        wh = rand(objects, 2) * 0.3 + 0.1
        centre = rand(objects, 2)
        axis = rand(objects) > 0.5  # which coordinate sits on an edge, and which edge
        centre[torch.arange(objects), axis.long()] = (rand(objects) > 0.5).float()
        return torch.cat([centre, wh], 1)
    raise ValueError(f"layout={name!r}; valid: {', '.join(OBJECTS)}")


def _model(name: str):
    torch.manual_seed(0)
    model = YOLO(name).model.train()
    model.args = DEFAULT_CFG
    return model


def _batch(model, batch: int, imgsz: int, name: str) -> dict:
    g = torch.Generator().manual_seed(0)
    boxes = layout(name, OBJECTS[name], g)
    return training_batch(model, batch, imgsz, OBJECTS[name], boxes=None if boxes is None else boxes.repeat(batch, 1))


def _measure(model, batch: dict, policy: str) -> tuple[int, int]:
    """The measured peak (bytes) of ``policy`` on ``batch`` and how many recomputations and chunked assignments ran."""
    with count_recomputations() as counter:
        peak = profile_step(model, batch, policy, flops=False).peak_bytes
    return peak, counter.total + counter.assignments


def case(model_key: str, name: str, imgsz: int, batch_size: int) -> list[dict]:
    """The rows of one model and layout (module docstring)."""
    model = _model(MODELS[model_key])
    task = model_task(model)
    batch = _batch(model, batch_size, imgsz, name)
    sizes = ObjectSizes.of_batch(batch, task)
    objects = OBJECTS[name]
    memory = MemoryModel(model, imgsz, batch_size, objects, sizes=sizes)
    worst = MemoryModel(model, imgsz, batch_size, objects)
    base = {"model": MODELS[model_key], "layout": name, "imgsz": imgsz, "batch": batch_size, "objects": objects}
    rows, none_peak = [], None
    for policy in POLICIES:
        peak, ran = _measure(model, batch, policy)
        none_peak = none_peak or peak
        rows.append({**base, "policy": policy, "estimated_bytes": memory.estimate(policy, batch_size, imgsz).peak_bytes,
                     "measured_bytes": peak, "recomputed": ran})
    rows[0]["estimated_no_layout_bytes"] = worst.estimate("none", batch_size, imgsz).peak_bytes
    for fraction in AUTO_FRACTIONS:
        budget = int(fraction * none_peak)
        row = {**base, "policy": f"auto@{fraction}", "budget_bytes": budget}
        try:
            plan = memory.plan(budget, batch_size, imgsz)
        except PlanError as e:  # nothing fits: the row says so
            rows.append({**row, "planned": f"nothing fits: {e}"})
            continue
        peak, ran = _measure(model, batch, plan.recompute)
        rows.append({**row, "planned": plan.recompute, "estimated_bytes": plan.estimated_peak_bytes, "measured_bytes": peak,
                     "recomputed": ran})
    if name == "large":
        budget = int(BATCH_BUDGET * none_peak)
        units = memory.units("backbone,loss")
        chosen = memory.largest_batch(units, budget, imgsz, limit=32)
        row = {**base, "policy": "batch=-1 (backbone,loss)", "budget_bytes": budget, "planned": f"batch={chosen}"}
        if chosen:
            peak, ran = _measure(model, _batch(model, chosen, imgsz, name), "backbone,loss")
            row.update(batch=chosen, estimated_bytes=memory.estimate("backbone,loss", chosen, imgsz).peak_bytes,
                       measured_bytes=peak, recomputed=ran)
        rows.append(row)
    return rows


def _mib(n) -> str:
    return "" if n is None else f"{n / 2**20:.0f}"


def summary(rows: list[dict]) -> dict:
    """The median relative error of the estimates and the share under; the budgets missed (auto, batch=-1)."""
    paired = [(r["estimated_bytes"], r["measured_bytes"]) for r in rows if "estimated_bytes" in r and "measured_bytes" in r]
    errors = [e / m - 1 for e, m in paired]
    missed = [r for r in rows if "budget_bytes" in r and r.get("measured_bytes", 0) > r["budget_bytes"]]
    return {"rows": len(errors), "median_error": statistics.median(errors) if errors else math.nan,
            "under": sum(e < 0 for e in errors), "most_bytes_under": max((m - e for e, m in paired), default=0),
            "budgets_missed": len(missed), "budget_rows": sum("budget_bytes" in r for r in rows),
            "worst_under": min(errors, default=math.nan), "worst_over": max(errors, default=math.nan)}


KEYS = ("render", "out", "cases", "imgsz", "batch")  # the key=value words main takes


def main(argv: list[str]) -> dict:
    opts = parse_keys(argv, KEYS, "benchmarks.memory_model.breaker")
    if "render" in opts:  # the tables again from a run's record.json (no measurement)
        result = json.loads(Path(opts["render"]).read_text())
        result["summary"] = summary(result["rows"])
        publish(result, report(result), opts.get("out"))
        return result
    imgsz, batch = int(opts.get("imgsz", 512)), int(opts.get("batch", 2))
    names = listed(opts["cases"]) if "cases" in opts else [f"{m}-{lay}" for m in MODELS for lay in OBJECTS]
    bad = [n for n in names if n.split("-", 1)[0] not in MODELS or n.split("-", 1)[-1] not in OBJECTS]
    if bad:
        raise SystemExit(f"cases={','.join(bad)}: not a case; valid: <{'|'.join(MODELS)}>-<{'|'.join(OBJECTS)}>")
    torch.set_num_threads(1)
    rows = []
    for name in names:
        model_key, lay = name.split("-", 1)
        for row in case(model_key, lay, imgsz, batch):
            rows.append(row)
            print(row, flush=True)
    result = {**provenance(["python -m benchmarks.memory_model.breaker", *argv], seeds=[0]), "load_average_1_5_15min": os.getloadavg(),
              "torch_threads": 1, "rows": rows, "summary": summary(rows)}
    publish(result, report(result), opts.get("out"))
    return result


def report(result: dict) -> list[str]:
    """The Markdown of a run's ``result`` (module docstring)."""
    s, rows = result["summary"], result["rows"]
    lines = [
        "The breaker suite: one training step's CPU live-tensor peak (AdamW's state included) against the memory model's",
        "estimate with the layout stated (the batch's box sizes, as data= gives them); `none` also without a layout (every",
        "box the whole image, what profile/plan assume without data= or object_size=). `auto@f`: the plan for f x `none`'s",
        "measured peak, measured; `batch=-1`: the largest batch of the default policy in 1.5x `none`'s peak, measured.",
        "",
        f"**{s['rows']} estimated rows: median error {s['median_error']:+.1%}, {s['under']} under (by at most {s['most_bytes_under']}"
        f" bytes, {s['worst_under']:+.1e}), most over {s['worst_over']:+.1%}; {s['budgets_missed']} of {s['budget_rows']} budgets"
        " missed.**",
        "",
        "| model | layout | objects | batch | policy | planned | estimated MiB | measured MiB | est / meas | budget MiB | "
        "within budget | no-layout est / meas |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        est, meas, budget = r.get("estimated_bytes"), r.get("measured_bytes"), r.get("budget_bytes")
        ratio = f"{est / meas:.3f}" + (" **under**" if est < meas else "") if est and meas else ""
        within = "" if budget is None or meas is None else ("yes" if meas <= budget else "**no**")
        worst = r.get("estimated_no_layout_bytes")
        lines.append(
            f"| {r['model']} | {r['layout']} | {r['objects']} | {r['batch']} | {r['policy']} | {r.get('planned', '')} | {_mib(est)} | "
            f"{_mib(meas)} | {ratio} | {_mib(budget)} | {within} | {'' if worst is None else f'{worst / meas:.3f}'} |"
        )
    lines += ["", f"Load average (1, 5, 15 min) at the end: {', '.join(f'{v:.2f}' for v in result['load_average_1_5_15min'])} "
              f"on {os.cpu_count()} cores"]
    return lines


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "benchmarks.memory_model.breaker"))
