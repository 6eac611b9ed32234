"""``step`` cells: peak memory and step time of one real training step per policy, against ``recompute=none`` in
the same process.

A step is forward, loss with targets (a fixed number of objects per image on a fixed synthetic batch of the model's
classes, :func:`yolo_ckpt.memory.synthetic_batch.training_batch`), backward and an AdamW step (the optimizer ``optimizer=auto``
picks for short runs, built by Ultralytics' builder; its state exists, as in every step after the first), under
AMP as Ultralytics trains a cell's ``amp``: fp16 autocast on CUDA, fp32 on the CPU (where Ultralytics turns it off). Peak
memory is measured by yolo-ckpt's one step harness, :func:`yolo_ckpt.memory.step.profile_step`, on a copy of the model:
parameters, gradients, optimizer state, the batch and activations; on CUDA the allocator's
``max_memory_allocated`` (less what was on the device before), elsewhere the live tensor storages
(:class:`yolo_ckpt.memory.tracker.LiveTensorTracker`). Step time is the median
over interleaved pairs (cell, baseline): a noisy shared machine slows both alike, and the ratio is what is
reported. Beside it the FLOP bound of the overhead: 1 + forward FLOPs of the recomputed layers (and of the whole
final head layer when its branches are recomputed: its decode is a small part) / FLOPs of a whole step without
recompute (``torch.utils.flop_counter``); the loss region's recomputed mask loss is not in it. It is a bound in FLOPs,
not in time: recomputed
forward convolutions cost less time per FLOP than a step's average (its backward convolutions are slower), so
measured ratios can come in under it; for ``selective`` it counts the whole forward of each layer, more than is
recomputed. The recomputations of one step are counted
(:func:`yolo_ckpt.count_recomputations`): modules (layers, inner blocks, head branches) and, apart, the images
whose mask loss the loss region recomputed; a policy that recomputed nothing would show 0.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode
from ultralytics import YOLO
from ultralytics.utils import DEFAULT_CFG

from yolo_ckpt import apply_checkpointing, count_recomputations
from yolo_ckpt.memory import amp_enabled, autocast_for, build_optimizer, layer_flops, profile_step, training_batch

from .cells import failed
from .planning import needs_memory_model, planned_cell, settle


def measure(cells: list[dict], settings: dict) -> list[dict]:
    """Rows of a group of step cells; ``cells[0]`` is their ``recompute=none`` baseline.

    Args:
        cells: matrix cells (:data:`yolo_ckpt.bench.cells.CELL_KEYS`) of one model.
        settings: ``objects`` per image, ``pairs`` of timed steps, ``device`` (default: CUDA if present), ``seed``.

    Returns:
        Per cell: status, imgsz and batch used, recompute (the layers, for auto), layers recomputed, recomputations
        per step (modules) and images whose mask loss was recomputed per step, peak bytes and MiB, median step time (s),
        time ratio against the baseline of this process, FLOP
        bound, and the step's FLOPs. A cell that raises while it is set up or its peak measured gets a
        ``failed`` row; the others go on.

    Raises:
        Exception: whatever the baseline cell raises (without it there is no ratio), or what a timed step raises;
            the whole group fails.
    """
    device = torch.device(settings["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(settings["seed"])
    model = YOLO(cells[0]["model"], task=cells[0]["task"]).model.train()  # the task's model class, built from its YAML
    model.args = DEFAULT_CFG  # the loss's hyperparameters: their values do not change its memory or time
    amp = amp_enabled(cells[0]["amp"], device.type)  # as Ultralytics trains (fp32 on the CPU); one per group: a baseline key
    planned = any(needs_memory_model(c) for c in cells)
    memory = planned_cell(cells[0], model, {**settings, "device": device.type, "optimizer": "AdamW"}).memory_model() if planned else None
    model.to(device)
    optimizer = build_optimizer(model, "AdamW")
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    runs, rows = [], []
    for cell in cells:
        try:
            plan = settle(cell, memory, free)
            batch = training_batch(model, plan["batch"], plan["imgsz"], settings["objects"], settings["seed"])  # kept on
            policy = apply_checkpointing(model, plan["recompute"], mode=cell["recompute_mode"])  # the CPU: no cell's
            autocast = autocast_for(amp, device.type)  # peak may count another cell's batch on the device
            with count_recomputations() as counter:  # the policy as applied, measured on a copy of the model
                peak = profile_step(model, _to(batch, device), None, cell["recompute_mode"], "AdamW", amp, flops=False).peak_bytes
            runs.append((cell, plan, batch, policy, autocast, peak, (counter.total, counter.loss_images)))
            rows.append(None)
        except Exception as e:
            if cell is cells[0]:
                raise  # no baseline, no ratios: the whole group fails with this reason
            rows.append(failed(e))
    times = _interleaved_times(runs, model, optimizer, settings["pairs"])
    flops = {}
    head = len(model.model) - 1  # the final task head: its branches are the 'head' region
    for (cell, plan, batch, policy, _, peak, (recomputations, loss_images)), seconds in zip(runs, times):
        key = (plan["imgsz"], plan["batch"])
        if key not in flops:
            flops[key] = _step_flops(model, _to(batch, device))
        step_flops, per_layer = flops[key]
        rows[cells.index(cell)] = {
            "status": "ok",
            "imgsz_used": plan["imgsz"],
            "batch_used": plan["batch"],
            "budget_MiB": plan["budget_bytes"] / 2**20 if plan["budget_bytes"] else float("nan"),
            "recomputed": policy.spec if cell["recompute"] != policy.spec else "",
            "layers": len(policy.indices),
            "recomputations_per_step": recomputations,
            "loss_images_recomputed_per_step": loss_images,
            "peak_bytes": peak,
            "peak_MiB": peak / 2**20,
            "step_time_s": statistics.median(seconds),
            "time_ratio": statistics.median(seconds) / statistics.median(times[0]),
            "flop_bound": 1 + sum(per_layer[i] for i in (*policy.indices, *((head,) if policy.head else ()))) / step_flops,
            "step_GFLOPs": step_flops / 1e9,
            "device": str(device),
        }
    return rows


def _to(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on ``device``."""
    return {k: v.to(device) for k, v in batch.items()}


def _step(model, optimizer, batch, autocast) -> None:
    """One training step: forward and loss (under autocast for amp), backward, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        loss, _ = model.loss(batch)
    loss.sum().backward()
    optimizer.step()


def _interleaved_times(runs, model, optimizer, pairs: int) -> list[list[float]]:
    """Seconds of ``pairs`` steps per run, each step of a cell next to one of the baseline (``runs[0]``)."""
    times = [[] for _ in runs]

    def timed(k: int) -> None:
        cell, plan, batch, _, autocast, _, _ = runs[k]
        apply_checkpointing(model, plan["recompute"], mode=cell["recompute_mode"])
        device = next(model.parameters()).device
        batch = _to(batch, device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        _step(model, optimizer, batch, autocast)
        sync()
        times[k].append(time.perf_counter() - t)

    for _ in range(pairs):
        for k in range(1, len(runs)):
            timed(k)
            timed(0)
        if len(runs) == 1:
            timed(0)
    return times


def _step_flops(model, batch) -> tuple[int, list[int]]:
    """(FLOPs of one step without recompute, forward FLOPs per layer) at this batch."""
    apply_checkpointing(model, "none")
    with FlopCounterMode(display=False) as counter:
        loss, _ = model.loss(batch)
        loss.sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops(), layer_flops(model, batch["img"])
